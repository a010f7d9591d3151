# SPDX-License-Identifier: Apache-2.0
# The planner (pure: abstract meshes, no MPI launch) and the `dtl` command-line tool.
dtl_unit_test(test_planner_optimal SOURCES test_planner_optimal.c)
dtl_unit_test(test_planner_dtensor SOURCES test_planner_dtensor.c)
dtl_unit_test(test_planner_errors SOURCES test_planner_errors.c)
dtl_unit_test(test_planner_explain SOURCES test_planner_explain.c)
dtl_unit_test(test_planner_limits SOURCES test_planner_limits.c)
dtl_unit_test(test_planner_scratch SOURCES test_planner_scratch.c)

# The `dtl` tool: each case runs it through sh, appends "exit=<status>" to its output, and matches the
# whole output, so the regular expression checks the text and the exit status together (0 done, 1 the
# request cannot be done, 2 bad arguments).
function(dtl_tool_case name expect)
  add_test(NAME ${name} COMMAND sh -c "p=\"$1\"; shift; \"$p\" \"$@\" 2>&1; echo \"exit=$?\"" sh $<TARGET_FILE:dtl_tool> ${ARGN})
  set_tests_properties(${name} PROPERTIES PASS_REGULAR_EXPRESSION "${expect}" LABELS "unit;tool" ENVIRONMENT "DTL_PLAN_TUNE=;DTL_PROFILE=")
endfunction()
dtl_tool_case(dtl_tool_plan "^plan S\\(0\\),R -> R,S\\(1\\)  mesh 2x4  shape \\[8,6\\] f32  \\(coordinate \\[0,0\\]\\)\n.*exchange +S\\(0\\),R->R,S\\(1\\) .*total  1 step, 1 collective, est [0-9.]+ us, scratch [0-9]+ B\nexit=0\n$"
              plan --mesh 2x4 --shape 8,6 --dtype f32 --from S0,R --to R,S1)
dtl_tool_case(dtl_tool_plan_coord_and_cost "\\(coordinate \\[1,3\\]\\)\ncost model  alpha 1e-05 s  beta 1e-09 s/B  local_beta 1e-10 s/B\n.*exit=0\n$"
              plan --mesh=2x4 --shape=8,6 --from=S0,R --to=R,S1 --coord 1,3 --alpha 1e-5 --beta 1e-9)
dtl_tool_case(dtl_tool_plan_unsupported "dtl plan: DTL_ERR_UNSUPPORTED: .*mesh dim 0: S\\(0\\) -> P\\(avg\\) is unsupported.*\nexit=1\n$"
              plan --mesh 2x4 --shape 8,6 --from S0,R --to P\(avg\),R)
dtl_tool_case(dtl_tool_plan_shard_to_partial "step 1  mesh dim 0  local embed     S\\(0\\)->P\\(sum\\) tensor dim 0 .*total  1 step, 0 collectives.*exit=0\n$"
              plan --mesh 2x4 --shape 8,6 --from S0,R --to P,R)
dtl_tool_case(dtl_tool_show "^f32\\[8,8\\] mesh=2x2 placements=S\\(0\\),S\\(1\\)\n.*\\[1,1\\] rank 3.*exit=0\n$"
              show --mesh 2x2 --shape 8,8 --dtype f32 S0,S1)
dtl_tool_case(dtl_tool_info "^dtl [0-9]+\\.[0-9]+\\.[0-9]+ .*CUDA/NCCL backend: .*mpi \\(host memory\\) +alpha=2e-06 .*inter_alpha=5e-06 inter_beta=8e-10 .*DTL_LOG .*DTL_LOG_SUBSYS .*DTL_LOG_FILE .*DTL_CHECK .*DTL_RANKS_PER_NODE .*DTL_PROFILE .*DTL_PLAN_TUNE .*exit=0\n$"
              info)
# Nodes: 4 ranks per node on 2x4 make mesh dim 0 cross nodes; the plan keeps bytes on dim 1 and explains each
# step's link class and bytes to other nodes; show lists the nodes.
dtl_tool_case(dtl_tool_plan_nodes "inter_alpha 5e-06 s  inter_beta 8e-10 s/B\nstep 1  mesh dim 1  reduce-scatter .* link intra  xnode 0 B .*\nstep 2  mesh dim 0  all-reduce .* send 1.0 KiB .* link inter  xnode 1.0 KiB .*\nstep 3  mesh dim 1  all-gather .*exit=0\n$"
              plan --mesh 2x4 --shape 32,32 --from P,P --to R,R --ranks-per-node 4)
dtl_tool_case(dtl_tool_show_nodes "\nnodes: ranks 0-3 on node 0, 4-7 on node 1 \\(mesh dim 0 crosses nodes\\)\n.*exit=0\n$"
              show --mesh 2x4 --shape 8,8 --ranks-per-node 4 S0,S1)
dtl_tool_case(dtl_tool_bad_ranks_per_node "--ranks-per-node \"0\": expected one whole number >= 1.*exit=2\n$"
              plan --mesh 2x4 --shape 8 --from S0,R --to R,R --ranks-per-node 0)
dtl_tool_case(dtl_tool_bad_inter_beta "--inter-beta \"x\": expected a finite number of seconds >= 0.*exit=2\n$"
              plan --mesh 2x4 --shape 8 --from S0,R --to R,R --inter-beta x)
dtl_tool_case(dtl_tool_help "^usage: dtl <command>.*plan .*show .*info .*exit=0\n$" --help)
# The 8-bit floats: named in the help, planned with their exact Partials, a sum refused with the reason.
dtl_tool_case(dtl_tool_help_dtypes "dtypes: f32 f64 f16 bf16 i8 u8 i32 i64 f8e4m3 f8e5m2 .*exit=0\n$" help)
dtl_tool_case(dtl_tool_plan_fp8 "shape \\[8,6\\] f8e4m3 .*reduce-scatter  P\\(max\\)->S\\(0\\) .*exit=0\n$"
              plan --mesh 2x4 --shape 8,6 --dtype f8e4m3 --from P\(max\),R --to S0,S1)
dtl_tool_case(dtl_tool_plan_fp8_sum "DTL_ERR_UNSUPPORTED: .*P\\(sum\\) cannot hold dtype f8e5m2: f8e5m2 sum would round at every step.*exit=1\n$"
              plan --mesh 2x4 --shape 8,6 --dtype float8_e5m2 --from S0,R --to P,R)
# Bad arguments: a message naming what was wrong, and exit status 2.
dtl_tool_case(dtl_tool_no_command "^usage: dtl .*exit=2\n$")
dtl_tool_case(dtl_tool_unknown_command "unknown command \"frobnicate\".*exit=2\n$" frobnicate)
dtl_tool_case(dtl_tool_bad_mesh "--mesh \"2y4\": expected 1 to 4 sizes >= 1.*exit=2\n$" plan --mesh 2y4 --shape 8,6 --from S0 --to R)
dtl_tool_case(dtl_tool_bad_shape "--shape \"8,-1\": expected 1 to 8 sizes >= 0.*exit=2\n$" plan --mesh 2 --shape 8,-1 --from S0 --to R)
dtl_tool_case(dtl_tool_bad_dtype "--dtype: .*text=\"f33\".*exit=2\n$" plan --mesh 2 --shape 8 --dtype f33 --from S0 --to R)
dtl_tool_case(dtl_tool_bad_placements "--from: .*exit=2\n$" plan --mesh 2 --shape 8 --from S\( --to R)
dtl_tool_case(dtl_tool_placement_count "--to \"R\" has 1 placement but the mesh has 2 dims.*exit=2\n$" plan --mesh 2x2 --shape 8 --from S0,R --to R)
dtl_tool_case(dtl_tool_shard_dim_out_of_range "--to \"S2\": .*S\\(2\\) is out of range.*exit=2\n$" plan --mesh 2 --shape 8,8 --from S0 --to S2)
dtl_tool_case(dtl_tool_missing_to "--to is required.*exit=2\n$" plan --mesh 2 --shape 8 --from S0)
dtl_tool_case(dtl_tool_bad_coord "--coord \"2,0\": coordinate 0 is 2 \\(expected 0..1\\).*exit=2\n$" plan --mesh 2x2 --shape 8 --from S0,R --to R,R --coord 2,0)
dtl_tool_case(dtl_tool_bad_alpha "--alpha \"-1\": expected a finite number of seconds >= 0.*exit=2\n$" plan --mesh 2 --shape 8 --from S0 --to R --alpha -1)
dtl_tool_case(dtl_tool_unknown_option "unknown option \"--frob\".*exit=2\n$" plan --frob 1)
dtl_tool_case(dtl_tool_show_without_placements "the placements are required.*exit=2\n$" show --mesh 2 --shape 8)
add_test(NAME dtl_tool_bad_plan_tune COMMAND sh -c "p=\"$1\"; shift; \"$p\" \"$@\" 2>&1; echo \"exit=$?\"" sh $<TARGET_FILE:dtl_tool>
         plan --mesh 2 --shape 8 --from S0 --to R)
set_tests_properties(dtl_tool_bad_plan_tune PROPERTIES LABELS "unit;tool" ENVIRONMENT "DTL_PLAN_TUNE=alpha=fast"
                     PASS_REGULAR_EXPRESSION "DTL_PLAN_TUNE=\"alpha=fast\": alpha=\"fast\" is not a finite number.*exit=2\n$")
# dtl calibrate: its options are checked before MPI starts; under the launcher it prints the model and writes a
# profile that loads (dtl info with DTL_PROFILE reports no warning).
dtl_tool_case(dtl_tool_calibrate_help "^usage: dtl <command>.*calibrate \\[--out FILE\\].*exit=0\n$" calibrate --help)
dtl_tool_case(dtl_tool_calibrate_unknown_option "dtl calibrate: unknown option \"--frob\" \\(expected --out FILE\\).*exit=2\n$"
              calibrate --frob)
dtl_tool_case(dtl_tool_calibrate_no_file "dtl calibrate: --out needs a file name.*exit=2\n$" calibrate --out)
set(dtl_calib_profile ${CMAKE_CURRENT_BINARY_DIR}/dtl_tool_calibrate_np2.profile)
add_test(NAME dtl_tool_calibrate_np2 COMMAND ${DTL_MPIEXEC} -n 2 $<TARGET_FILE:dtl_tool> calibrate --out ${dtl_calib_profile})
set_tests_properties(dtl_tool_calibrate_np2 PROPERTIES LABELS "mpi;tool" ENVIRONMENT "${DTL_MPI_ENV};DTL_PROFILE="
                     PROCESSORS 2 TIMEOUT 120 FIXTURES_SETUP dtl_calib_profile
                     PASS_REGULAR_EXPRESSION "calibrated on 2 ranks \\(mpi\\):\n  alpha [0-9.e+-]+ s .*dtl-profile 1\n  engine mpi\n  ranks 2\n.*  cost alpha=.*  table all_to_allv ")
add_test(NAME dtl_tool_info_with_profile COMMAND sh -c "p=\"$1\"; shift; \"$p\" \"$@\" 2>&1; echo \"exit=$?\"" sh $<TARGET_FILE:dtl_tool> info)
set_tests_properties(dtl_tool_info_with_profile PROPERTIES LABELS "unit;tool" ENVIRONMENT "DTL_PROFILE=${dtl_calib_profile}"
                     FIXTURES_REQUIRED dtl_calib_profile PASS_REGULAR_EXPRESSION "now \"[^\"]*dtl_tool_calibrate_np2.profile\".*exit=0\n$"
                     FAIL_REGULAR_EXPRESSION "warning")
