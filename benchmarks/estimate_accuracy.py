"""The estimate for machines you do not have, scored on published llama.cpp decode figures its fit never saw.

    python -m benchmarks.estimate_accuracy          # the table, then fit and score figures; exit 1 on a miss

ondevice/roofline/data/decode_measurements.csv marks each row split=fit (the shipped fit,
estimate_fit.json, rests on it) or split=score (held out). Reported: the fit rows' leave-one-out error
(what the printed range is built from) and, on the score rows, the shipped fit's median error, the
share within ±15%, and the share inside the printed range (which claims the 10th-90th percentile:
about 80%). Targets: median <= 6%, >= 85% within ±15%, >= 75% inside the range.
"""

from __future__ import annotations

import argparse
import statistics
import sys

MEDIAN, WITHIN, BAND, COVER = 0.06, 0.85, 0.15, 0.75


def main(argv: list[str] | None = None) -> int:
    argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter).parse_args(argv)
    from ondevice.roofline import estimate as est

    rows = est.load_measurements()
    fit = est.load_fit()
    scored = est.score_rows(rows)
    print(
        f"{'device':<32} {'backend':<7} {'model':<12} {'quant':<7} {'test':<8} {'tok/s':>7} {'est':>7} "
        f"{'range':>13} {'meas/est':>8}"
    )
    ratios, inside = [], []
    for m in scored:
        e = est.estimate(m.backend, m.quant, m.bytes_per_token, m.nameplate_gbs, fit)
        ratios.append(m.tok_s / e.tok_s)
        inside.append(e.low_tok_s <= m.tok_s <= e.high_tok_s)
        print(
            f"{m.device[:32]:<32} {m.backend:<7} {m.model[:12]:<12} {m.quant:<7} {m.test:<8} {m.tok_s:>7.2f} "
            f"{e.tok_s:>7.2f} {e.low_tok_s:>6.1f}-{e.high_tok_s:<6.1f} {ratios[-1]:>8.2f}{'' if inside[-1] else ' out'}"
        )
    errors = [abs(r - 1) for r in ratios]
    median = statistics.median(errors)
    within = sum(e <= BAND for e in errors) / len(errors)
    cover = sum(inside) / len(inside)
    sources = sorted({m.source.split(" (")[0] for m in scored})
    print(
        f"\nfit: {fit.n_rows} rows, leave-one-out median error {fit.loo_median_abs_error:.1%}, "
        f"range {fit.ratio_low:.2f}-{fit.ratio_high:.2f} x the estimate"
    )
    print(
        f"score: {len(scored)} held-out rows: median error {median:.1%}, {within:.0%} within ±{BAND:.0%}, "
        f"{cover:.0%} inside the printed range"
    )
    print("score rows from: " + "; ".join(sources))
    met = median <= MEDIAN and within >= WITHIN and cover >= COVER
    print(
        "targets met"
        if met
        else f"targets MISSED (median <= {MEDIAN:.0%}, >= {WITHIN:.0%} within ±{BAND:.0%}, >= {COVER:.0%} in range)"
    )
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
