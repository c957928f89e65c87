# The torch-free unit tests of the quant library: built by tests/CMakeLists.txt, and under ASan and
# UBSan by tests/fuzz/CMakeLists.txt (scripts/fuzz runs them before it fuzzes).
set(AMAQ_QUANT_TEST_SOURCES
  half_test.cc bitpack_test.cc grid_test.cc codec_test.cc aqsgd_test.cc bit_budget_test.cc
  activation_cache_test.cc isa_test.cc)
list(TRANSFORM AMAQ_QUANT_TEST_SOURCES PREPEND ${CMAKE_CURRENT_LIST_DIR}/)
