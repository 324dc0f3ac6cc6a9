# ctest build.cuda_without_cublas (tests/build/CMakeLists.txt): configure the project in BINARY_DIR with CUDA on and
# cuBLAS off, build `latentq`, and check what it says about the attention.
#   cmake -DSOURCE_DIR=<repo> -DBINARY_DIR=<folder> -DGENERATOR=<gen> -DCXX_COMPILER=<c++> -DCUDA_COMPILER=<nvcc>
#         [-DCUDA_HOST_COMPILER=..] [-DCXX_LAUNCHER=..] [-DCUDA_LAUNCHER=..] -DJOBS=<n> -DDUMP=<tiny-mla.h5>
#         -DCONFIG=<a one-quantizer study with the attention probe> -P cuda_without_cublas.cmake
#   1. configure: -DLATENTQ_CUDA=ON -DLATENTQ_CUBLAS=OFF, one CUDA architecture (90), no tests, benchmarks or
#      Python module; the configure log must say that the attention stays on the CPU;
#   2. build the target `latentq` (it links study/device/backend_cuda.cpp and attention_device_none.cpp);
#   3. `latentq --version` must print "devices: cpu, cuda (attention on the CPU: built without cuBLAS)";
#   4. `latentq run CONFIG --input DUMP --device cuda --no-e2e`: without a GPU, exit 2 with "no CUDA device
#      available" (the CUDA backend, not the stub, is linked); on a GPU, exit 0 with the one line saying that
#      the attention probes run on the CPU because the build has no cuBLAS.
foreach(v SOURCE_DIR BINARY_DIR GENERATOR CXX_COMPILER CUDA_COMPILER JOBS DUMP CONFIG)
  if(NOT DEFINED ${v} OR "${${v}}" STREQUAL "")
    message(FATAL_ERROR "cuda_without_cublas.cmake: -D${v}=... is required")
  endif()
endforeach()

function(step what)
  string(TIMESTAMP t0 "%s")
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  string(TIMESTAMP t1 "%s")
  math(EXPR dt "${t1} - ${t0}")
  set(step_rc "${rc}" PARENT_SCOPE)
  set(step_out "${out}" PARENT_SCOPE)
  set(step_err "${err}" PARENT_SCOPE)
  message(STATUS "${what}: exit ${rc} after ${dt} s")
endfunction()
function(fail what)  # the step's output as it is (FATAL_ERROR would re-wrap it), then the verdict
  message("--- stdout (end) ---\n${tail_out}\n--- stderr (end) ---\n${tail_err}")
  message(FATAL_ERROR "${what}")
endfunction()
# the last 6000 characters of each stream, for a failure message
macro(tails)
  foreach(s out err)
    string(LENGTH "${step_${s}}" n)
    if(n GREATER 6000)
      math(EXPR at "${n} - 6000")
      string(SUBSTRING "${step_${s}}" ${at} -1 tail_${s})
    else()
      set(tail_${s} "${step_${s}}")
    endif()
  endforeach()
endmacro()

set(args -S ${SOURCE_DIR} -B ${BINARY_DIR} -G ${GENERATOR} -DCMAKE_BUILD_TYPE=Release
         -DCMAKE_CXX_COMPILER=${CXX_COMPILER} -DCMAKE_CUDA_COMPILER=${CUDA_COMPILER} -DCMAKE_CUDA_ARCHITECTURES=90
         -DLATENTQ_CUDA=ON -DLATENTQ_CUBLAS=OFF -DBUILD_TESTING=OFF -DLATENTQ_BENCH=OFF -DLATENTQ_PYTHON=OFF)
foreach(pair CUDA_HOST_COMPILER:CMAKE_CUDA_HOST_COMPILER CXX_LAUNCHER:CMAKE_CXX_COMPILER_LAUNCHER
             CUDA_LAUNCHER:CMAKE_CUDA_COMPILER_LAUNCHER)
  string(REPLACE ":" ";" pair "${pair}")
  list(GET pair 0 from)
  list(GET pair 1 to)
  if(NOT "${${from}}" STREQUAL "")
    list(APPEND args -D${to}=${${from}})
  endif()
endforeach()

step("configure ${BINARY_DIR} (LATENTQ_CUDA=ON, LATENTQ_CUBLAS=OFF)" ${CMAKE_COMMAND} ${args})
tails()
if(NOT step_rc EQUAL 0)
  fail("configure with -DLATENTQ_CUBLAS=OFF failed")
endif()
string(FIND "${step_out}" "LATENTQ_CUBLAS=OFF: `--device cuda` runs the attention probes on the CPU" at)
if(at EQUAL -1)
  fail("the configure log does not say that LATENTQ_CUBLAS=OFF keeps the attention on the CPU")
endif()

step("build latentq" ${CMAKE_COMMAND} --build ${BINARY_DIR} --target latentq -j ${JOBS})
tails()
if(NOT step_rc EQUAL 0)
  fail("the CUDA build without cuBLAS does not build `latentq`")
endif()

set(bin ${BINARY_DIR}/latentq)
step("latentq --version" ${bin} --version)
tails()
string(FIND "${step_out}" "\ndevices: cpu, cuda (attention on the CPU: built without cuBLAS)\n" at)
if(NOT step_rc EQUAL 0 OR at EQUAL -1)
  fail("`latentq --version` of the build without cuBLAS: expected exit 0 and the line "
       "\"devices: cpu, cuda (attention on the CPU: built without cuBLAS)\"")
endif()
message(STATUS "${step_out}")

set(results ${BINARY_DIR}/run_device_cuda.h5)
file(REMOVE ${results} ${results}.partial)
step("latentq run --device cuda" ${bin} run ${CONFIG} --input ${DUMP} --device cuda --no-e2e --threads 2
     --out ${results})
tails()
file(REMOVE ${results} ${results}.partial)
string(FIND "${step_err}" "--device cuda: no CUDA device available (" no_gpu)
string(FIND "${step_err}"
       "--device cuda: the attention probes run on the CPU: this build has no cuBLAS (configured with LATENTQ_CUBLAS=OFF"
       on_cpu)
if(step_rc EQUAL 2 AND NOT no_gpu EQUAL -1)
  message(STATUS "no GPU here: `--device cuda` reached the CUDA backend, which found no device (exit 2)")
elseif(step_rc EQUAL 0 AND NOT on_cpu EQUAL -1)
  message(STATUS "on the GPU: the study ran, its attention probes on the CPU, and said so")
else()
  fail("`latentq run --device cuda` of the build without cuBLAS: expected exit 2 with \"no CUDA device available\" "
       "(no GPU) or exit 0 saying that the attention probes run on the CPU (a GPU); got exit ${step_rc}")
endif()
