"""The plan step's report: cost curves on this machine beside the packing machine's, and what
auto plans with each. Runs where the built pyspec is importable (it uses the engine's planner)."""

from __future__ import annotations

from pyspec import _core

ALPHAS = (0.5, 0.6, 0.7, 0.8, 0.9)
GAMMA_MAX = 16


def plans(curves: dict) -> list[dict]:
    """What auto's planner chooses with these curves (no correction learnt yet): for each
    per-token acceptance alpha, the chain length of a draft model (drafting at the draft's
    one-token cost) and of a free draft (prompt lookup, drafting costs nothing), and the expected
    speed-up over plain decoding."""
    model = _core.CostModel()
    model.set_prior(_core.CostCurve(curves["target"]["n_tokens"], curves["target"]["ms"]))
    step_ms = list(model.table(GAMMA_MAX + 1, False))
    draft_ms = _core.CostCurve(curves["draft"]["n_tokens"], curves["draft"]["ms"]).at(1)
    plain = 1.0 / step_ms[1]
    rows = []

    def speedup(plan) -> float:
        return plan.expected_tokens / plan.ms / plain if plan.gamma else 1.0

    for alpha in ALPHAS:
        chain = _core.plan_chain(alpha, step_ms, draft_ms, GAMMA_MAX)
        free = _core.plan_chain(alpha, step_ms, 0.0, GAMMA_MAX)
        rows.append({"alpha": alpha,
                     "chain": (chain.gamma, speedup(chain)), "free": (free.gamma, speedup(free))})
    return rows


def _curve_rows(name: str, here: dict, ref: dict | None, here_label: str, ref_label: str) -> list[str]:
    ks = here["n_tokens"]
    t1 = here["ms"][0]
    lines = [f"| {name} | " + " | ".join(str(k) for k in ks) + " |",
             "|---|" + "---|" * len(ks),
             f"| {here_label}, ms | " + " | ".join(f"{t:.2f}" for t in here["ms"]) + " |",
             f"| {here_label}, x k=1 | " + " | ".join(f"{t / t1:.2f}" for t in here["ms"]) + " |"]
    if ref is not None:
        ref_curve = _core.CostCurve(ref["n_tokens"], ref["ms"])
        r1 = ref_curve.at(1)
        lines += [f"| {ref_label}, ms | " + " | ".join(f"{ref_curve.at(k):.2f}" for k in ks) + " |",
                  f"| {ref_label}, x k=1 | " + " | ".join(f"{ref_curve.at(k) / r1:.2f}" for k in ks) + " |"]
    return lines


def plan_report(measured: dict, manifest: dict, backend: str) -> str:
    here_label = "GPU (CUDA)" if backend == "cuda" else "CPU"
    ref = manifest.get("cpu_reference")
    ref_label = "packing CPU" if ref else ""
    shapes = manifest["shapes"]
    out = [f"## Cost of one decode of k tokens: random-weight models of the {shapes.get('of', {}).get('target', 'quick')} "
           f"target's and {shapes.get('of', {}).get('draft', 'quick')} draft's shapes and tensor types",
           "", f"{here_label}: {measured['system_info'].strip()}"]
    if ref:
        out.append(f"packing CPU: {ref['machine']} (its curves of the real models)")
    for role in ("target", "draft"):
        out += [""] + _curve_rows(role, measured["curves"][role], ref["curves"].get(role) if ref else None,
                                  here_label, ref_label)
    sets = [(here_label, measured["curves"])] + ([(ref_label, ref["curves"])] if ref else [])
    out += ["", "## What auto plans: draft length (gamma) and expected speed-up over plain decoding", "",
            "per-token acceptance alpha; 'draft model': each draft token costs the draft's one-token decode; "
            "'free draft': prompt lookup or pool phrases, drafting costs nothing", ""]
    head = "| alpha | " + " | ".join(f"{label}: draft model | {label}: free draft" for label, _ in sets) + " |"
    out += [head, "|---|" + "---|---|" * len(sets)]
    tables = [plans(curves) for _, curves in sets]
    for i, alpha in enumerate(ALPHAS):
        cells = []
        for rows in tables:
            (cg, cs), (fg, fs) = rows[i]["chain"], rows[i]["free"]
            cells += [f"gamma {cg}, {cs:.2f}x", f"gamma {fg}, {fs:.2f}x"]
        out.append(f"| {alpha:.1f} | " + " | ".join(cells) + " |")
    return "\n".join(out)
