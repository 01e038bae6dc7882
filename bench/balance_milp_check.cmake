# ctest check of cobalt_balance_milp (bench/balance_milp.cpp) on a small dump: the MILP answers
# agree with the layouts' floors, and bad arguments exit 2 with one line.
#   cmake -DCLI=<cobalt> -DMILP=<cobalt_balance_milp> -DWORK=<scratch dir> -P balance_milp_check.cmake
file(REMOVE_RECURSE "${WORK}")
execute_process(
  COMMAND "${CLI}" simulate --preset coactivated-late --steps 3 --tokens-per-step 128
          --cluster 2x4 --policies static,cobalt+ --dump "${WORK}"
  RESULT_VARIABLE rc OUTPUT_QUIET ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "cobalt simulate --dump failed (${rc}): ${err}")
endif()

foreach(policy static cobalt+)
  execute_process(COMMAND "${MILP}" "${WORK}" ${policy} --time-limit 1
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "cobalt_balance_milp ${policy} failed (${rc}): ${err}")
  endif()
  string(REPLACE "\n" ";" lines "${out}")
  set(num_rows 0)
  foreach(line IN LISTS lines)
    # layer step tasks cap floor_used floor_prev, then the two solver answers
    if(NOT line MATCHES "^([0-9]+) +([0-9]+) +([0-9]+) +([0-9]+) +([0-9]+) +([0-9]+) +(.+[^ ])   *(.+[^ ]) *$")
      continue()
    endif()
    math(EXPR num_rows "${num_rows} + 1")
    set(cap ${CMAKE_MATCH_4})
    set(floor_used ${CMAKE_MATCH_5})
    set(floor_prev ${CMAKE_MATCH_6})
    set(any_layout "${CMAKE_MATCH_7}")
    set(new_replicas "${CMAKE_MATCH_8}")
    # A layout with floor <= cap is a feasible point of both MILPs.
    if(NOT floor_used GREATER cap AND any_layout STREQUAL "infeasible")
      message(FATAL_ERROR "${policy}: layout within the cap but MILP infeasible: ${line}")
    endif()
    if(NOT floor_prev GREATER cap AND NOT new_replicas MATCHES "^(opt 0|<= 0 |unknown)")
      message(FATAL_ERROR "${policy}: previous layout within the cap needs no new replica: ${line}")
    endif()
    # Every expert has at least one replica: 128 experts in the preset.
    if(any_layout MATCHES "^opt ([0-9]+)$" AND CMAKE_MATCH_1 LESS 128)
      message(FATAL_ERROR "${policy}: fewer replicas than experts: ${line}")
    endif()
  endforeach()
  # 2 layers x 2 steps after the first.
  if(NOT num_rows EQUAL 4)
    message(FATAL_ERROR "${policy}: expected 4 rows, got ${num_rows}:\n${out}")
  endif()
endforeach()

foreach(args "${WORK};nope" "${WORK};static;--time-limit" "${WORK};static;--tolerance;x"
             "${WORK};static;--bogus;1" "${WORK}")
  execute_process(COMMAND "${MILP}" ${args} RESULT_VARIABLE rc OUTPUT_VARIABLE out
                  ERROR_VARIABLE err)
  string(REGEX MATCHALL "\n" newlines "${err}")
  list(LENGTH newlines num_newlines)
  if(NOT rc EQUAL 2 OR NOT num_newlines EQUAL 1 OR NOT err MATCHES "^error: ")
    message(FATAL_ERROR "'${args}': expected exit 2 and one 'error:' line, got ${rc}: ${err}")
  endif()
endforeach()
