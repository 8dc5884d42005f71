"""Agent sandbox operations for the operation tests (``test_operations``): round trips, the
property strategy, unknown targets and invalid values, on the demo fleet (tenants acme and
globex, products chat and code)."""

from __future__ import annotations

from hypothesis import strategies as st

from firedrill.model import operations as ops

HASH = "sha256:" + "1c" * 32
TOOLSET = "sha256:" + "7e" * 32
TENANTS = ("acme", "globex")
PROMPT = ops.InjectPromptInjection("acme", "use1-a", HASH, "money", 0.2, 0.5)

ROUND_TRIPS: list[tuple[str, tuple[ops.Operation, ...], ops.Operation]] = [
    ("inject-exfil", (), ops.InjectExfiltration("acme", "use1-a", 2.0)),
    (
        "exfil-rate",
        (ops.InjectExfiltration("acme", "use1-a", 2.0),),
        ops.InjectExfiltration("acme", "use1-a", 5.0),
    ),
    (
        "clear-exfil",
        (ops.InjectExfiltration("globex", "usw2-b", 1.0),),
        ops.ClearExfiltration("globex", "usw2-b"),
    ),
    ("inject-prompt", (), PROMPT),
    ("clear-prompt", (PROMPT,), ops.ClearPromptInjection("acme", HASH)),
    ("warm-pool", (), ops.SetWarmPool("acme", 0)),
    ("freeze-bundle", (), ops.FreezePromotions("chat", "bundle")),
    (
        "unfreeze-toolset",
        (ops.FreezePromotions("code", "toolset"),),
        ops.UnfreezePromotions("code", "toolset"),
    ),
    ("promote-toolset", (), ops.PromoteToolset("llm-8b", TOOLSET)),
    ("block-hash", (), ops.BlockContentHash("globex", HASH)),
    ("unblock-hash", (ops.BlockContentHash("acme", HASH),), ops.UnblockContentHash("acme", HASH)),
]

UNKNOWN_TARGETS: list[ops.Operation] = [
    ops.InjectExfiltration("initech", "use1-a"),
    ops.InjectExfiltration("acme", "mars-a"),
    ops.ClearExfiltration("initech", "use1-a"),
    ops.InjectPromptInjection("initech", "use1-a", HASH),
    ops.InjectPromptInjection("acme", "mars-a", HASH),
    ops.SetWarmPool("initech", 0),
    ops.FreezePromotions("search", "bundle"),
    ops.UnfreezePromotions("search", "toolset"),
    ops.PromoteToolset("llm-1t", TOOLSET),
    ops.BlockContentHash("initech", HASH),
    ops.RunCompensations("initech", 0.0),
    ops.QuarantinePod("sbx-tenant-acme/sess-000000-0"),
]

INVALID_VALUES: list[ops.Operation] = [
    ops.InjectExfiltration("acme", "use1-a", 0.0),
    ops.InjectExfiltration("acme", "use1-a", float("nan")),
    ops.InjectPromptInjection("acme", "use1-a", ""),
    ops.InjectPromptInjection("acme", "use1-a", HASH, "read"),  # type: ignore[arg-type]
    ops.InjectPromptInjection("acme", "use1-a", HASH, rate_per_s=-1.0),
    ops.InjectPromptInjection("acme", "use1-a", HASH, approved_share=1.5),
    ops.SetWarmPool("acme", -1),
    ops.FreezePromotions("chat", "weights"),  # type: ignore[arg-type]
    ops.PromoteToolset("llm-8b", "latest"),
    ops.BlockContentHash("acme", " "),
    ops.RunCompensations("acme", -5.0),
]

_tenant = st.sampled_from(TENANTS)
_cells = st.sampled_from(("use1-a", "usw2-b", "euw1-a"))
_hash = st.sampled_from((HASH, "sha256:" + "2d" * 32))
_product = st.sampled_from(("chat", "code"))
_kind = st.sampled_from(("bundle", "toolset"))
LEVERS: st.SearchStrategy[ops.Operation] = st.one_of(
    st.builds(ops.InjectExfiltration, _tenant, _cells, st.sampled_from((0.5, 2.0))),
    st.builds(ops.ClearExfiltration, _tenant, _cells),
    st.builds(
        ops.InjectPromptInjection,
        _tenant,
        _cells,
        _hash,
        st.sampled_from(("write", "money")),
        st.sampled_from((0.1, 1.0)),
        st.sampled_from((0.0, 0.25)),
    ),
    st.builds(ops.ClearPromptInjection, _tenant, _hash),
    st.builds(ops.SetWarmPool, _tenant, st.integers(0, 60)),
    st.builds(ops.FreezePromotions, _product, _kind),
    st.builds(ops.UnfreezePromotions, _product, _kind),
    st.builds(ops.BlockContentHash, _tenant, _hash),
    st.builds(ops.UnblockContentHash, _tenant, _hash),
    st.builds(ops.SetFlag, st.sampled_from(("acme.max_side_effect", "proxy.deny_all")), st.none()),
)
