# ctest install_and_consume: installs this build into a scratch prefix, builds examples/cpp against
# it with find_package(cobalt) as another project would, and runs the program.
#   cmake -DBUILD=<build dir> -DSOURCE=<checkout> -DWORK=<scratch dir> -DGENERATOR=<generator>
#         -DCXX=<C++ compiler> -P install_and_consume.cmake
file(REMOVE_RECURSE "${WORK}")
function(run)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "failed (${rc}): ${ARGN}\n${out}\n${err}")
  endif()
endfunction()

run("${CMAKE_COMMAND}" --install "${BUILD}" --prefix "${WORK}/prefix")
foreach(file bin/cobalt include/cobalt/policy/policy.hpp lib/cmake/cobalt/cobaltConfig.cmake)
  if(NOT EXISTS "${WORK}/prefix/${file}")
    message(FATAL_ERROR "the install lacks ${file}")
  endif()
endforeach()
run("${CMAKE_COMMAND}" -S "${SOURCE}/examples/cpp" -B "${WORK}/example" -G "${GENERATOR}"
    "-DCMAKE_CXX_COMPILER=${CXX}" "-DCMAKE_PREFIX_PATH=${WORK}/prefix" -DCMAKE_BUILD_TYPE=Release)
run("${CMAKE_COMMAND}" --build "${WORK}/example")

# The program runs a policy over four steps and prints one line per step, and what a layout change
# copies (cobalt+ re-plans after its first step).
execute_process(COMMAND "${WORK}/example/policy_steps" cobalt+ 4
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0 OR NOT out MATCHES "cobalt\\+ on 2 nodes x 4 GPUs" OR
   NOT out MATCHES "\n   3    4096 " OR NOT out MATCHES "layout change: [0-9]+ replica copies")
  message(FATAL_ERROR "policy_steps cobalt+ 4: exit ${rc}\n${out}\n${err}")
endif()
# A bad policy name is the library's one-line error, and a non-zero exit.
execute_process(COMMAND "${WORK}/example/policy_steps" no-such-policy 2
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 1 OR NOT err MATCHES "no-such-policy" OR NOT err MATCHES "cobalt\\+")
  message(FATAL_ERROR "policy_steps no-such-policy: exit ${rc}\n${err}")
endif()
file(REMOVE_RECURSE "${WORK}")
