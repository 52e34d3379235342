# cmake -DINPUT=file -DOUTPUT=file.inc -DNAME=kIdentifier -P EmbedText.cmake
#
# Writes OUTPUT: a C++ raw string constant NAME holding INPUT's text, so
# that one file can be both compiled (by the CUDA backend) and embedded
# (in the kernels the compiler generates).
file(READ "${INPUT}" TEXT)
string(FIND "${TEXT}" ")megac\"" CLASH)
if(NOT CLASH EQUAL -1)
  message(FATAL_ERROR "${INPUT} contains the raw string's delimiter")
endif()
file(WRITE "${OUTPUT}.tmp"
  "// Generated from ${INPUT} by cmake/EmbedText.cmake: do not edit.\n"
  "static const char ${NAME}[] = R\"megac(${TEXT})megac\";\n")
file(COPY_FILE "${OUTPUT}.tmp" "${OUTPUT}" ONLY_IF_DIFFERENT)
file(REMOVE "${OUTPUT}.tmp")
