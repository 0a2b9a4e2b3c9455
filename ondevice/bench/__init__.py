"""`ondevice bench`: repeatable latency measurements with percentiles, cache states split,
and the roofline beside them (docs/metrics.md, docs/bench.md).

    from ondevice.bench import BenchConfig, get_suite, run_bench, scenario_results
    outcome = run_bench(BenchConfig(models=(None,), suite=get_suite("quick"), scenarios=DEFAULT_SCENARIOS))
    for r in scenario_results(outcome): r.summary("itl_s").p50

Modules: suites (workloads, exact-length prompts), runner (plan, interleaved runs),
scenarios (one request each), stats, record, report, compare, slo, oscache.
"""

from ondevice.bench.runner import BenchConfig, BenchOutcome, plan_bench, run_bench
from ondevice.bench.runs import DEFAULT_SCENARIOS, SCENARIOS, RunRecord
from ondevice.bench.stats import ScenarioResult, scenario_results
from ondevice.bench.suites import Suite, Workload, custom_suite, get_suite

__all__ = [
    "BenchConfig",
    "BenchOutcome",
    "plan_bench",
    "run_bench",
    "RunRecord",
    "SCENARIOS",
    "DEFAULT_SCENARIOS",
    "ScenarioResult",
    "scenario_results",
    "Suite",
    "Workload",
    "custom_suite",
    "get_suite",
]
