# cmake -DSOURCE=<repo> -DOUT=<file> -P build_stamp.cmake: writes OUT, a header naming the commit the
# sources are at and whether tracked files differ from it, at every build; the file is rewritten
# only when that changes, so nothing recompiles otherwise. Outside a git checkout: "unknown".
execute_process(COMMAND git -C "${SOURCE}" rev-parse HEAD OUTPUT_VARIABLE commit
                OUTPUT_STRIP_TRAILING_WHITESPACE RESULT_VARIABLE failed ERROR_QUIET)
set(dirty false)
if(failed)
  set(commit unknown)
else()
  execute_process(COMMAND git -C "${SOURCE}" status --porcelain --untracked-files=no OUTPUT_VARIABLE changes
                  ERROR_QUIET)
  if(NOT changes STREQUAL "")
    set(dirty true)
  endif()
endif()
set(text "// Written by cmake/build_stamp.cmake at build time.\n#pragma once\n#define AMAQ_BUILD_COMMIT \"${commit}\"\n#define AMAQ_BUILD_DIRTY ${dirty}\n")
if(EXISTS "${OUT}")
  file(READ "${OUT}" old)
endif()
if(NOT old STREQUAL text)
  file(WRITE "${OUT}" "${text}")
endif()
