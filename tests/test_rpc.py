"""The target's layers on llama.cpp rpc-servers (Engine(rpc=...)): clear errors everywhere, and,
where the libllama has the RPC backend and ggml-rpc-server is built, greedy output over two
loopback servers equal to the local run.

The loopback tests (conftest's rpc_servers) need llama-cpp-python built with -DGGML_RPC=on and
`pyspec rpc-server --build` (scripts/rpc_check.sh does both in a separate environment and runs
them); without them they skip, saying so, unless PYSPEC_REQUIRE_RPC=1 makes that a failure."""

from __future__ import annotations

import logging
import socket

import pytest

import pyspec
from pyspec.errors import InvalidArgumentError, ModelLoadError
from pyspec.rpc import RpcServer, RpcServerError, find_rpc_server, free_port, rpc_supported

METHODS = ("none", "chain", "tree", "lookup", "ouroboros", "auto")
PROMPT = "def fibonacci(n):\n    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n    return a\n\n" * 2


@pytest.mark.parametrize("rpc, what", [
    ("localhost", "is not host:port"),
    ("127.0.0.1:", "is not host:port"),
    (":50052", "is not host:port"),
    ("127.0.0.1:0", "is not host:port"),
    ("127.0.0.1:65536", "is not host:port"),
    ("127.0.0.1:50x", "is not host:port"),
    ("[::1]:50052", "is not host:port"),
])
def test_malformed_endpoints_are_refused_by_name(tiny_target: str, rpc: str, what: str) -> None:
    with pytest.raises(InvalidArgumentError, match=what) as info:
        pyspec.Engine(tiny_target, rpc=rpc, n_ctx=256)
    assert repr(rpc.split(",")[0])[1:-1] in str(info.value)


def test_rpc_arguments_are_checked_before_any_connection(tiny_target: str) -> None:
    with pytest.raises(InvalidArgumentError, match="listed twice"):
        pyspec.Engine(tiny_target, rpc="127.0.0.1:50052, 127.0.0.1:50052", n_ctx=256)
    with pytest.raises(InvalidArgumentError, match="n_gpu_layers=0"):
        pyspec.Engine(tiny_target, rpc="127.0.0.1:50052", n_gpu_layers=0, n_ctx=256)
    with pytest.raises(TypeError, match="rpc must be"):
        pyspec.Engine(tiny_target, rpc=50052, n_ctx=256)  # type: ignore[arg-type]
    assert pyspec.engine.rpc_servers(" a:1 ,b:2,") == ("a:1", "b:2")
    assert pyspec.engine.rpc_servers(["a:1"]) == ("a:1",) and pyspec.engine.rpc_servers(None) == ()


def test_a_library_without_rpc_or_a_silent_server_is_a_clear_load_error(tiny_target: str) -> None:
    """Without the RPC backend the message says how to build one; with it, a port nobody listens
    on is named (ggml-rpc itself would abort the process there)."""
    endpoint = f"127.0.0.1:{free_port()}"
    with pytest.raises(ModelLoadError) as info:
        pyspec.Engine(tiny_target, rpc=endpoint, n_ctx=256)
    if rpc_supported():
        assert f"cannot reach the RPC server at {endpoint}" in str(info.value)
    else:
        assert "built without llama.cpp's RPC backend" in str(info.value)
        assert "-DGGML_RPC=on" in str(info.value)
    # The process and a local engine are fine afterwards.
    with pyspec.Engine(tiny_target, n_ctx=256) as engine:
        assert engine.generate("hello", max_tokens=4, method="none").stats.n_generated == 4


def test_rpc_server_missing_is_named(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    monkeypatch.setenv("PYSPEC_RPC_SERVER", str(tmp_path / "nowhere" / "ggml-rpc-server"))
    with pytest.raises(RpcServerError, match="pyspec rpc-server --build"):
        find_rpc_server()


def _outputs(engine: pyspec.Engine, **options: object) -> dict[str, list[int]]:
    out = {}
    for method in METHODS:
        result = engine.generate(PROMPT, max_tokens=48, method=method, n_draft=4, temperature=0.0, **options)
        if "backend_argmax" in options:
            assert result.stats.backend_argmax == options["backend_argmax"], method
        out[method] = list(result.tokens)
    return out


def test_greedy_output_over_two_rpc_servers_equals_the_local_run(tiny_target: str, tiny_drafts: dict[str, str],
                                                                  rpc_servers, caplog: pytest.LogCaptureFixture) -> None:
    draft = tiny_drafts["perturbed"]
    with pyspec.Engine(tiny_target, draft=draft, n_ctx=1024, n_threads=2) as local:
        expected = _outputs(local)
    endpoints = [server.endpoint for server in rpc_servers]
    for servers in (endpoints[:1], endpoints):
        caplog.clear()
        with caplog.at_level(logging.DEBUG, logger="pyspec.llama"), \
                pyspec.Engine(tiny_target, draft=draft, n_ctx=1024, n_threads=2, rpc=servers) as remote:
            # llama.cpp put weights on every server (its load log names each endpoint's buffer)
            for endpoint in servers:
                assert f"[{endpoint}] model buffer size" in caplog.text
            assert remote.rpc == tuple(servers) and remote.n_gpu_layers == -1
            got = _outputs(remote)
            drafted = remote.generate(PROMPT, max_tokens=48, method="chain", n_draft=4).stats
        assert got == expected, f"over {servers}"
        assert drafted.n_drafted > 0 and drafted.n_accepted > 0


def test_backend_argmax_on_the_rpc_servers_gives_the_local_tokens(tiny_target: str, tiny_drafts: dict[str, str],
                                                                  rpc_servers) -> None:
    """The rows' argmax taken in the graph on the server (only the tokens cross the network)."""
    draft = tiny_drafts["perturbed"]
    with pyspec.Engine(tiny_target, draft=draft, n_ctx=1024, n_threads=2) as local:
        expected = _outputs(local)
    with pyspec.Engine(tiny_target, draft=draft, n_ctx=1024, n_threads=2, rpc=rpc_servers[0].endpoint) as remote:
        assert not remote.generate(PROMPT, max_tokens=8, method="none").stats.backend_argmax  # None: a local GPU only
        assert _outputs(remote, backend_argmax=True) == expected


def test_a_server_that_goes_away_between_loads_is_named(tiny_target: str, rpc_servers) -> None:
    with RpcServer(threads=1) as server:
        endpoint = server.endpoint
    with pytest.raises(ModelLoadError, match=f"cannot reach the RPC server at {endpoint}"):
        pyspec.Engine(tiny_target, rpc=[rpc_servers[0].endpoint, endpoint], n_ctx=256)


def test_part_of_the_layers_on_the_server(tiny_target: str, rpc_servers) -> None:
    with pyspec.Engine(tiny_target, n_ctx=512, n_threads=2) as local:
        expected = local.generate(PROMPT, max_tokens=24, method="none").tokens
    with pyspec.Engine(tiny_target, n_ctx=512, n_threads=2, n_gpu_layers=1, rpc=rpc_servers[0].endpoint) as split:
        assert split.generate(PROMPT, max_tokens=24, method="none").tokens == expected


def test_loopback_port_helper_finds_a_port_nobody_uses() -> None:
    port = free_port()
    with socket.socket() as s:
        assert s.connect_ex(("127.0.0.1", port)) != 0


def test_cli_names_what_is_missing(tiny_target: str, monkeypatch: pytest.MonkeyPatch, tmp_path,
                                   capsys: pytest.CaptureFixture[str]) -> None:
    from pyspec.cli.main import main

    monkeypatch.setenv("PYSPEC_RPC_SERVER", str(tmp_path / "ggml-rpc-server"))
    assert main(["rpc-server", "--build-only"]) == 1
    assert "pyspec rpc-server --build" in capsys.readouterr().err
    assert main(["generate", "--target", tiny_target, "--rpc", "somewhere", "--prompt", "x"]) == 1
    assert "'somewhere' is not host:port" in capsys.readouterr().err
