# Runs the GoogleTest binaries (every executable in bin/ ending in
# "unittests") as lit tests, one lit test per gtest case.
import os

import lit.formats

config.name = "megac-unit"
config.test_format = lit.formats.GoogleTest(".", "unittests")
config.test_source_root = config.unittests_dir
config.test_exec_root = config.unittests_dir
