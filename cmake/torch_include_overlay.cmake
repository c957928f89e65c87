# PyTorch's wheels ship, beside LibTorch's own headers, copies of the libraries they were built with
# (torch/include/fmt: fmt 12; torch/include/google: protobuf), which would shadow Debian's fmt 9
# (that Debian's spdlog needs) and protobuf 3.21 (that our generated .pb.h needs). Where an include
# folder of LibTorch's imported targets holds such copies, it is replaced by a folder of links to
# everything else in it: build-torch-include/<hash of the folder> in the source tree, one path
# whatever the build folder, so that two build trees (scripts/build's, gpu-check's) share ccache
# entries. Debian's LibTorch lives in /usr/include, a compiler default, and is left as it is.
foreach(_target torch torch_library torch_cpu torch_cpu_library c10 torch_global_deps)
  if(NOT TARGET ${_target})
    continue()
  endif()
  get_target_property(_includes ${_target} INTERFACE_INCLUDE_DIRECTORIES)
  if(NOT _includes)
    continue()
  endif()
  set(_replaced)
  foreach(_dir IN LISTS _includes)
    file(REAL_PATH ${_dir} _real)
    if((EXISTS ${_dir}/fmt OR EXISTS ${_dir}/google) AND NOT _real IN_LIST CMAKE_CXX_IMPLICIT_INCLUDE_DIRECTORIES)
      string(MD5 _key ${_real})
      set(_overlay ${PROJECT_SOURCE_DIR}/build-torch-include/${_key})
      file(GLOB _entries RELATIVE ${_dir} ${_dir}/*)
      foreach(_entry IN LISTS _entries)
        if(NOT _entry STREQUAL "fmt" AND NOT _entry STREQUAL "google" AND NOT IS_SYMLINK ${_overlay}/${_entry})
          file(MAKE_DIRECTORY ${_overlay})
          file(CREATE_LINK ${_dir}/${_entry} ${_overlay}/${_entry} SYMBOLIC)
        endif()
      endforeach()
      list(APPEND _replaced ${_overlay})
    else()
      list(APPEND _replaced ${_dir})
    endif()
  endforeach()
  set_target_properties(${_target} PROPERTIES INTERFACE_INCLUDE_DIRECTORIES "${_replaced}")
endforeach()
if(_overlay)
  message(STATUS "LibTorch's bundled fmt and protobuf headers left out: its headers are used through ${_overlay}")
endif()
