# ctest `study.cli_missing_dump`: `latentq run --input <missing>` exits 2 with
# "latentq: error:" on stderr and writes nothing.   cmake -DLATENTQ=... -DOUT=... -P expect_exit2.cmake
file(REMOVE ${OUT})
execute_process(COMMAND ${LATENTQ} run --input ${OUT}.missing-dump.h5 --out ${OUT}
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 2)
  message(FATAL_ERROR "expected exit code 2, got ${rc}\nstdout: ${out}\nstderr: ${err}")
endif()
if(NOT err MATCHES "^latentq: error: .*missing-dump.h5: no such file")
  message(FATAL_ERROR "unexpected stderr: ${err}")
endif()
if(EXISTS ${OUT})
  message(FATAL_ERROR "${OUT} was written")
endif()
message(STATUS "exit 2, nothing written: ${err}")
