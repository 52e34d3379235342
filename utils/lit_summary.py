#!/usr/bin/env python3
"""Prints a closing 'N passed, N failed, N skipped' line from lit's xunit XML."""
import sys
import xml.etree.ElementTree as ET

root = ET.parse(sys.argv[1]).getroot()
cases = root.iter("testcase")
passed = failed = skipped = 0
for case in cases:
    if case.find("failure") is not None or case.find("error") is not None:
        failed += 1
    elif case.find("skipped") is not None:
        skipped += 1
    else:
        passed += 1
print(f"tests: {passed} passed, {failed} failed, {skipped} skipped")
