#!/usr/bin/env bash
# `make test`'s lint and pytest runs (docs/testing.md, "Running them"). The tests that measure on
# the wall clock, the integration tests (marker `integration`: everything under
# tests/integration, and the Spark tests that run against a real Kafka broker; tests/conftest.py
# marks them), run one after another in one pytest, exactly as a serial run would, so no two of
# them ever share the machine: they are the suite's length. Everything else runs beside them,
# one step after another: the lint (ruff, mypy, the import contracts), the unit and packaging
# tests, then the Spark tests that need no broker (batch jobs on a local session and on a
# standalone Spark cluster, compared with pandas; none of them times anything). CPU-bound work
# beside the wire tests is a condition they must stand anyway (issue 39 asks the suite to pass
# with a busy loop on the host), and it takes those minutes off the suite's length. The
# simulator's scenario-seeds among the unit tests run in two worker processes at nice 19
# (kqpsim/pool.py), and the Spark tests beside run at nice 19 too: they take only the CPU the
# real-time tests leave. What ran beside is printed when both sides have ended; the exit status
# fails if any step failed.
set -u
cd "$(dirname "$0")/.."
pytest=.venv/bin/pytest
beside_dir=$(mktemp -d -t kqp-beside-XXXXXX)
(
  # Each step's output to its own log, its exit status to its own file; a failed step does not
  # stop the next, so one run shows every failure.
  make --no-print-directory lint > "$beside_dir/lint.log" 2>&1
  echo $? > "$beside_dir/lint.rc"
  "$pytest" -q -p no:cacheprovider --basetemp "$beside_dir/unit-tmp" --durations=10 tests/unit tests/packaging \
    > "$beside_dir/unit.log" 2>&1
  echo $? > "$beside_dir/unit.rc"
  nice -n 19 "$pytest" -q -p no:cacheprovider --basetemp "$beside_dir/spark-tmp" --durations=10 \
    -m "not integration" tests/spark > "$beside_dir/spark.log" 2>&1
  echo $? > "$beside_dir/spark.rc"
  date +%T > "$beside_dir/ended"
) &
beside=$!
# However this script ends early: stop the steps beside (the subshell first, so that it starts
# no further step, then the step it is running).
trap 'kill -STOP "$beside" 2>/dev/null; pkill -P "$beside"; kill "$beside" 2>/dev/null; kill -CONT "$beside" 2>/dev/null' EXIT
real_time_log=$(mktemp -t kqp-real-time-tests-XXXXXX.log)
"$pytest" -q --durations=15 -m integration tests/integration tests/spark 2>&1 | tee "$real_time_log"
real_time=${PIPESTATUS[0]}
real_time_ended=$(date +%T)
wait "$beside"
trap - EXIT
# Which line was the suite's length (docs/testing.md, "What that took off the suite's length").
echo
echo "==== the real-time tests ended at $real_time_ended, the steps beside them at $(cat "$beside_dir/ended" 2>/dev/null) ===="
rest=0
for step in lint:"ruff, mypy, lint-imports" unit:"tests/unit and tests/packaging" \
            spark:"tests/spark without a broker (-m 'not integration')"; do
  name=${step%%:*}
  code=$(cat "$beside_dir/$name.rc" 2>/dev/null || echo "not run")
  echo
  echo "==== beside them: ${step#*:} (exit $code) ===="
  cat "$beside_dir/$name.log" 2>/dev/null
  [ "$code" = 0 ] || rest=1
done
if [ "$real_time" -ne 0 ]; then
  # Last, where a reader of a long log (or of its tail) looks: what each failed real-time test
  # asserted, the lines pytest marks "E", which the tracebacks above put far apart.
  echo
  echo "==== the real-time tests' failures, again (exit $real_time) ===="
  grep -E '^(E  |FAILED |ERROR |_{3,} .* _{3,}$)' "$real_time_log" | cut -c1-400 | head -80
fi
rm -rf "$beside_dir" "$real_time_log"
[ "$real_time" -eq 0 ] && [ "$rest" -eq 0 ]
