"""Hostile engines: what a tenant's engine sends oomguard in its HTTP answers, tried as an attacker would.

Each engine here is a real aiohttp server on 127.0.0.1, scraped by the real Runtime behind make_app (the
path of a production scrape: the scraper, the extractor, the engine's reader, the exposition). The table of
cases is `CASES`; docs/faults.md prints it, and `test_docs_table_is_current` keeps the two equal. Each case
fails without the guard it holds (see docs/faults.md, "Hostile input"). Waits are on conditions with a
deadline, never a bare sleep.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import re
from collections.abc import Callable

from aiohttp import web
from hostile_cases import Case, assert_documented
from support import REPO, fixture_body, samples, until, vllm_body

from oomguard.exporter.config_loader import load_config
from oomguard.exporter.exposition import encoder, health
from oomguard.exporter.runtime import Runtime
from oomguard.exporter.web import make_app

CASES = [
    Case("health", "an endless `/health` body", "at most 4 KiB read, then the connection closed; "
         "health judged by its status alone", "test_endless_health_body_is_not_read"),
    Case("requests", "a plugin's own request, without cap or timeout", "every request to an engine goes "
         "through `engine_client.get` (timeout, no redirect, body cap); a test holds that no other code sends one",
         "test_every_engine_request_goes_through_engine_client_get"),
    Case("cache", "a fresh 1 MB label value on each scrape (the limit raised)", "the exposition's label-prefix "
         "cache bounded in bytes (16 MiB), emptied when full; a prefix over 64 KiB never kept",
         "test_rotating_label_values_keep_the_prefix_cache_bounded"),
    Case("limits", "a 100,000-character label value", 'the reading dropped whole, `kind="limit"` '
         "(`label_value_length_limit`)", "test_a_long_label_value_drops_the_reading"),
    Case("limits", "10,000 `model_name` values", 'the reading dropped whole, `kind="limit"` (`sample_limit`)',
         "test_too_many_samples_drop_the_reading"),
    Case("limits", "one series with 700,000 labels (6.6 MB)", 'the reading dropped whole, `kind="limit"` '
         "(`label_limit`), counted before a label is parsed", "test_a_series_with_too_many_labels_drops_the_reading"),
    Case("values", "KV cache use NaN, +Inf, -5 or 1e308 (vLLM, SGLang, TGI, Triton), llama.cpp's running "
         "requests NaN, +Inf or -5 (its KV use is `/slots`' JSON), vLLM's `gpu_memory_utilization` 7",
         "the value dropped, `oomguard_target_values_rejected_total{reason}` +1; the rest of the reading kept",
         "test_bad_values_are_dropped_and_counted"),
    Case("values", "the same series three times in one body", 'the reading dropped whole, `kind="parse"` '
         "(never summed)", "test_a_duplicate_series_is_malformed"),
]  # fmt: skip


def test_docs_table_is_current() -> None:
    assert_documented(CASES, globals())


MIB = 1024 * 1024
VLLM = vllm_body("vllm-0.32.0-cpu-under-load.txt")
KV_LINE = 'vllm:kv_cache_usage_perc{engine="0",model_name="tiny"} 0.7142857142857143'
RUNNING_LINE = 'vllm:num_requests_running{engine="0",model_name="tiny"} 4.0'
WAITING_LINE = 'vllm:num_requests_waiting{engine="0",model_name="tiny"} 1.0'
assert KV_LINE in VLLM and RUNNING_LINE in VLLM and WAITING_LINE in VLLM


def runtime_app(targets: dict[str, tuple[str, str]], **target_settings: object) -> web.Application:
    """The exporter with `targets` (name -> (url, engine)), no NVML, no event sources."""
    config = load_config(
        None,
        {
            "targets": [
                {"name": name, "url": "http://127.0.0.1:9", "engine": engine, "local_process": "no",
                 **target_settings}
                for name, (_, engine) in targets.items()
            ],
            "scrape": {"timeout_seconds": 2.0},
            "nvml": {"enabled": False},
            "events": {"kernel_log": False, "xid": False},
            "trend": {"enabled": False},
        },
    )  # fmt: skip
    # Tests only: each target's URL gets its behaviour's path (configured URLs take no path).
    config = config.model_copy(
        update={"targets": tuple(t.model_copy(update={"url": targets[t.name][0]}) for t in config.targets)}
    )
    return make_app(Runtime(config, nvml_lib=None))


def errors(text: str, target: str) -> dict[str, float]:
    """The target's scrape errors by kind, those above zero."""
    return {
        dict(labels)["kind"]: v
        for (name, labels), v in samples(text).items()
        if name == "oomguard_target_scrape_errors_total" and dict(labels)["target"] == target and v
    }


def rejected(text: str, target: str) -> dict[str, float]:
    """The target's rejected values by reason, those above zero."""
    return {
        dict(labels)["reason"]: v
        for (name, labels), v in samples(text).items()
        if name == "oomguard_target_values_rejected_total" and dict(labels)["target"] == target and v
    }


def series(text: str, name: str, target: str) -> list[float]:
    return [v for (n, labels), v in samples(text).items() if n == name and dict(labels).get("target") == target]


# -- /health ------------------------------------------------------------------------------------------------
class EndlessHealth:
    """A good /metrics and a /health that never ends its body; counts what it managed to send."""

    def __init__(self) -> None:
        self.sent = 0
        self.done = asyncio.Event()

    async def health(self, request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse()
        await response.prepare(request)
        chunk = b"ok" * 32 * 1024
        try:
            with contextlib.suppress(ConnectionError):
                while True:  # the fault itself: no end (the client's hang-up ends it)
                    await response.write(chunk)
                    self.sent += len(chunk)
        finally:
            self.done.set()
        return response

    async def metrics(self, request: web.Request) -> web.Response:
        return web.Response(text=VLLM)


async def test_endless_health_body_is_not_read(aiohttp_client, aiohttp_server) -> None:
    engine = EndlessHealth()
    app = web.Application()
    app.router.add_get("/metrics", engine.metrics)
    app.router.add_get("/health", engine.health)
    server = await aiohttp_server(app)
    client = await aiohttp_client(runtime_app({"endless": (f"http://127.0.0.1:{server.port}", "vllm")}))
    text = await (await client.get("/metrics")).text()
    # The answer's status is what tells the engine's health: 200, read at once, whatever the body after it.
    assert series(text, "oomguard_target_health_status_code", "endless") == [200.0]
    assert series(text, "oomguard_target_up", "endless") == [1.0]
    await until(engine.done.is_set, 5, "the engine's /health handler ends: the exporter hung up")
    # What the server wrote before the hang-up: the exporter's few kB and the sockets' buffers, no more.
    assert engine.sent < 16 * MIB, f"the exporter read a /health body of {engine.sent / MIB:.0f} MiB"


def test_every_engine_request_goes_through_engine_client_get() -> None:
    """No module of the engines or of the scraper sends a request itself: `engine_client.get` (the timeout, the
    redirect policy, the body cap) is the only way out, so a new plugin cannot forget one of them."""
    package = REPO / "exporter" / "oomguard" / "exporter"  # the simulators, the engines' side, are under simulate/
    # The engines' client itself has no timeout: `client.get(` past engine_client.get would send one without it.
    request = re.compile(r"\b(session|client)\.(get|post|put|patch|delete|head|request|ws_connect)\(|"
                         r"aiohttp\.request\(|\.read\(\)|\.text\(\)|\.json\(\)")  # fmt: skip
    files = [package / "sources" / "targets.py", *sorted((package / "engines").rglob("*.py"))]
    assert len(files) > 20 and all(path.is_file() for path in files), files  # the paths are the package's
    offenders = [
        f"{path.relative_to(REPO)}:{number}: {line.strip()}"
        for path in files
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if request.search(line)
    ]
    assert not offenders, "requests to an engine outside engine_client.get:\n" + "\n".join(offenders)


# -- /metrics bodies ----------------------------------------------------------------------------------------
class Bodies:
    """One server: /<name>/metrics answers bodies[name] (a callable, called on each request)."""

    def __init__(self, bodies: dict[str, Callable[[], str]]) -> None:
        self.bodies = bodies
        self.slots: dict[str, str] = {}  # llama.cpp's /slots, by name

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/{name}/metrics", self.metrics)
        app.router.add_get("/{name}/health", self.health)
        app.router.add_get("/{name}/slots", self.get_slots)
        return app

    async def metrics(self, request: web.Request) -> web.Response:
        return web.Response(text=self.bodies[request.match_info["name"]]())

    async def health(self, request: web.Request) -> web.Response:
        return web.Response(text="")

    async def get_slots(self, request: web.Request) -> web.Response:
        return web.Response(text=self.slots.get(request.match_info["name"], "[]"), content_type="application/json")


async def serve(aiohttp_server, bodies: Bodies) -> str:
    server = await aiohttp_server(bodies.app())
    return f"http://127.0.0.1:{server.port}"


def prefix_cache_bytes() -> int:
    """The bytes the exposition's label-prefix cache holds: each prefix and the label values of its key."""
    return sum(
        len(prefix) + sum(len(v) for v in labels) + sum(len(v) for v in pod or ())
        for (_, labels, pod), prefix in encoder._PREFIXES.items()
    )


async def test_rotating_label_values_keep_the_prefix_cache_bounded(aiohttp_client, aiohttp_server) -> None:
    scrapes = iter(range(1000))

    def rotating() -> str:  # a fresh 1 MB model_name on each scrape, in three families the reader keeps
        model = f'model_name="m{next(scrapes)}-' + "x" * MIB + '"'
        lines = [KV_LINE, RUNNING_LINE, WAITING_LINE]
        return "\n".join([VLLM, *(line.replace('model_name="tiny"', model) for line in lines)]) + "\n"

    base = await serve(aiohttp_server, Bodies({"rotating": rotating}))
    # The limit raised above the values, as an operator might: the cache must hold on its own.
    client = await aiohttp_client(
        runtime_app({"rotating": (f"{base}/rotating", "vllm")}, label_value_length_limit=2 * MIB)
    )
    for _ in range(8):
        text = await (await client.get("/metrics")).text()
        assert series(text, "oomguard_target_up", "rotating") == [1.0]
        assert prefix_cache_bytes() <= 16 * MIB, f"the prefix cache holds {prefix_cache_bytes() / MIB:.0f} MiB"
    assert encoder.PREFIX_CACHE_MAX_BYTES == 16 * MIB  # the bound documented in docs/engines.md
    # Values under the largest prefix kept (64 KiB): the cache fills, is emptied and fills again, within its bound.
    spec = health.TARGET_UP
    for i in range(600):  # 600 x 60 KB: twice the bound
        out = encoder.Exposition((spec,), frozenset({spec}))
        out.add(spec, (f"t{i}-" + "z" * 60_000,), 1.0)
        assert out.render()
        assert prefix_cache_bytes() == encoder.prefix_cache_bytes() <= 16 * MIB


async def test_a_long_label_value_drops_the_reading(aiohttp_client, aiohttp_server, caplog) -> None:
    long = VLLM.replace(RUNNING_LINE, RUNNING_LINE.replace('model_name="tiny"', f'model_name="{"y" * 100_000}"'))
    base = await serve(aiohttp_server, Bodies({"long": lambda: long, "good": lambda: VLLM}))
    client = await aiohttp_client(runtime_app({"long": (f"{base}/long", "vllm"), "good": (f"{base}/good", "vllm")}))
    for scrape in (1, 2):
        text = await (await client.get("/metrics")).text()
        assert series(text, "oomguard_target_up", "long") == [0.0]
        assert errors(text, "long") == {"limit": scrape}
        assert series(text, "oomguard_engine_requests_running", "long") == []  # dropped whole, not half
        assert series(text, "oomguard_engine_kv_cache_usage_ratio", "long") == []
        assert series(text, "oomguard_engine_requests_running", "good") == [4.0]
    assert "y" * 1000 not in text
    # Logged once (the same error again is not repeated), naming the limit and the settings that raise it.
    [line] = [r.getMessage() for r in caplog.records if "target long:" in r.getMessage()]
    assert "label value length limit of 1024" in line and "scrape.label_value_length_limit" in line, line


async def test_too_many_samples_drop_the_reading(aiohttp_client, aiohttp_server) -> None:
    many = "".join(f'vllm:num_requests_running{{engine="0",model_name="m{i}"}} 1\n' for i in range(10_000))
    base = await serve(aiohttp_server, Bodies({"many": lambda: VLLM + many}))
    client = await aiohttp_client(runtime_app({"many": (f"{base}/many", "vllm")}))
    text = await (await client.get("/metrics")).text()
    assert series(text, "oomguard_target_up", "many") == [0.0]
    assert errors(text, "many") == {"limit": 1}
    assert series(text, "oomguard_engine_requests_running", "many") == []
    assert len(text) < 200_000, f"the exposition grew to {len(text)} bytes"


async def test_a_series_with_too_many_labels_drops_the_reading(aiohttp_client, aiohttp_server) -> None:
    wide = "vllm:num_requests_running{" + ",".join(f'l{i}=""' for i in range(700_000)) + "} 1\n"
    assert len(wide) < 8 * MIB  # under the body cap: the limit must stop it
    base = await serve(aiohttp_server, Bodies({"wide": lambda: VLLM + wide}))
    client = await aiohttp_client(runtime_app({"wide": (f"{base}/wide", "vllm")}))
    text = await (await client.get("/metrics")).text()
    assert series(text, "oomguard_target_up", "wide") == [0.0]
    assert errors(text, "wide") == {"limit": 1}
    assert series(text, "oomguard_engine_requests_running", "wide") == []


# -- values -------------------------------------------------------------------------------------------------
SGLANG = fixture_body("sglang", "sglang-0.5.x-tp1.prom")
TGI = fixture_body("tgi", "tgi-3.x.prom")
TRITON = fixture_body("triton", "triton-trtllm-25.x.prom")
LLAMACPP = fixture_body("llamacpp", "metrics.prom")
SGLANG_KV = re.compile(r"^(sglang:token_usage\{[^}]*\}) \S+$", re.M)
# The other ways each engine tells its KV use, taken out so that the hostile value is the only one.
SGLANG_OTHER_KV = re.compile(r"^sglang:(full_token_usage|kv_used_tokens)\{.*\n", re.M)
TRITON_FRACTION = re.compile(r'^(nv_trt_llm_kv_cache_block_metrics\{kv_cache_block_type="fraction"[^}]*\}) \S+$', re.M)
TRITON_USED = re.compile(r'^nv_trt_llm_kv_cache_block_metrics\{kv_cache_block_type="used".*\n', re.M)


def vllm_kv(v: str) -> str:
    return VLLM.replace(KV_LINE, KV_LINE.rsplit(" ", 1)[0] + " " + v)


def sglang_kv(v: str) -> str:
    return SGLANG_KV.sub(lambda m: f"{m.group(1)} {v}", SGLANG_OTHER_KV.sub("", SGLANG))


def tgi_kv(v: str) -> str:  # TGI's KV use: the running batch's tokens over the capacity
    return re.sub(r"^tgi_batch_current_max_tokens \S+$", f"tgi_batch_current_max_tokens {v}", TGI, flags=re.M)


def triton_kv(v: str) -> str:  # the backend's own fraction (used / max blocks taken out)
    return TRITON_FRACTION.sub(lambda m: f"{m.group(1)} {v}", TRITON_USED.sub("", TRITON))


def llamacpp_running(v: str) -> str:  # its KV use is /slots' JSON (held below); its counts are /metrics'
    return re.sub(r"^llamacpp:requests_processing \S+$", f"llamacpp:requests_processing {v}", LLAMACPP, flags=re.M)


# (engine, body with the value, the series it would reach, the value's reason for each hostile value)
ENGINE_CASES: list[tuple[str, Callable[[str], str], str]] = [
    ("vllm", vllm_kv, "oomguard_engine_kv_cache_usage_ratio"),
    ("sglang", sglang_kv, "oomguard_engine_kv_cache_usage_ratio"),
    ("tgi", tgi_kv, "oomguard_engine_kv_cache_usage_ratio"),
    ("triton", triton_kv, "oomguard_engine_kv_cache_usage_ratio"),
    ("llamacpp", llamacpp_running, "oomguard_engine_requests_running"),
]
HOSTILE_VALUES = {"NaN": "non_finite", "+Inf": "non_finite", "-5": "negative", "1e308": "out_of_range"}
# TGI's and Triton's KV use is a quotient: 1e308 tokens over the capacity is out of 0-1 once divided.
# llama.cpp's running requests are a count: 1e308 is no ratio, and a count has no upper bound.
KEPT = {("llamacpp", "1e308")}


async def test_bad_values_are_dropped_and_counted(aiohttp_client, aiohttp_server) -> None:
    bodies: dict[str, Callable[[], str]] = {}
    expected: dict[str, tuple[str, str, str]] = {}
    for engine, body, name in ENGINE_CASES:
        for hostile, reason in HOSTILE_VALUES.items():
            if (engine, hostile) in KEPT:
                continue
            target = f"{engine}-{hostile}"
            bodies[target] = lambda body=body, hostile=hostile: body(hostile)
            expected[target] = (engine, name, reason)
    # gpu_memory_utilization (vLLM's reservation, a label value): 7 is no share of a GPU.
    bodies["vllm-reservation"] = lambda: VLLM.replace('gpu_memory_utilization="0.92"', 'gpu_memory_utilization="7"')
    expected["vllm-reservation"] = ("vllm", "oomguard_engine_gpu_memory_utilization_ratio", "out_of_range")
    server = Bodies(bodies)
    # llama.cpp's /slots: non-finite and negative sizes are skipped there.
    for target in bodies:
        server.slots[target] = '[{"n_ctx": NaN, "is_processing": true, "n_prompt_tokens": 1e308}]'
    base = await serve(aiohttp_server, server)
    targets = {target: (f"{base}/{target}", engine) for target, (engine, _, _) in expected.items()}
    client = await aiohttp_client(runtime_app(targets))
    text = await (await client.get("/metrics")).text()
    for target, (_, name, reason) in expected.items():
        assert series(text, "oomguard_target_up", target) == [1.0], target  # the rest of the reading stands
        assert series(text, name, target) == [], (target, series(text, name, target))
        assert rejected(text, target) == {reason: 1.0}, (target, rejected(text, target))
        assert all(math.isfinite(v) for v in series(text, "oomguard_engine_requests_waiting", target)), target
        assert series(text, "oomguard_engine_requests_waiting", target), target


async def test_a_duplicate_series_is_malformed(aiohttp_client, aiohttp_server) -> None:
    thrice = VLLM.replace(RUNNING_LINE, "\n".join([RUNNING_LINE] * 3))
    base = await serve(aiohttp_server, Bodies({"thrice": lambda: thrice}))
    client = await aiohttp_client(runtime_app({"thrice": (f"{base}/thrice", "vllm")}))
    text = await (await client.get("/metrics")).text()
    assert series(text, "oomguard_engine_requests_running", "thrice") == []  # never 3 x 4
    assert series(text, "oomguard_target_up", "thrice") == [0.0]
    assert errors(text, "thrice") == {"parse": 1}
