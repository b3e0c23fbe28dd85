"""The command line: `pyspec generate` (JSON and streaming) and error reporting."""

from __future__ import annotations

import json
import subprocess
import sys
import types
from pathlib import Path

import pytest

from pyspec.cli.main import build_parser
from pyspec.demo import DemoRun, format_table

STATS_KEYS = {"acceptance_rate", "tokens_per_target_call", "tokens_per_second", "n_target_calls", "n_drafted", "n_accepted"}


def pyspec_cli(*args: str) -> subprocess.CompletedProcess:
    # cwd: tests/, so that `python -c` imports the installed package, not the source tree beside it.
    return subprocess.run([sys.executable, "-c", "import sys; from pyspec.cli.main import main; sys.exit(main())", *args],
                          capture_output=True, text=True, timeout=300, cwd=Path(__file__).parent)


def test_generate_json(tiny_target: str, tiny_drafts: dict[str, str]) -> None:
    out = {}
    for method in ("none", "chain"):
        p = pyspec_cli("generate", "--target", tiny_target, "--draft", tiny_drafts["perturbed"], "--prompt", "def f():",
                       "--max-tokens", "24", "--method", method, "--n-draft", "3", "--json")
        assert p.returncode == 0, p.stderr
        out[method] = json.loads(p.stdout)
        assert set(out[method]) >= {"text", "tokens", "finish_reason", "stats"}
        assert STATS_KEYS <= set(out[method]["stats"])
        assert out[method]["finish_reason"] == "length"
    assert out["chain"]["tokens"] == out["none"]["tokens"]
    assert out["chain"]["stats"]["n_drafted"] > 0


def test_generate_streams_text_and_prompt_file(tiny_target: str, tmp_path: Path) -> None:
    prompt = tmp_path / "prompt.txt"
    prompt.write_text("hello world", encoding="utf-8")
    p = pyspec_cli("generate", "--target", tiny_target, "--prompt-file", str(prompt), "--max-tokens", "10", "--chat")
    assert p.returncode == 0, p.stderr
    assert "[auto] 10 tokens" in p.stderr
    j = pyspec_cli("generate", "--target", tiny_target, "--prompt-file", str(prompt), "--max-tokens", "10", "--chat", "--json")
    assert p.stdout.rstrip("\n") == json.loads(j.stdout)["text"]


def test_generate_errors_are_one_line(tiny_target: str, tmp_path: Path) -> None:
    p = pyspec_cli("generate", "--target", str(tmp_path / "missing.gguf"), "--prompt", "x")
    assert p.returncode == 1
    assert "pyspec: error:" in p.stderr and "missing.gguf" in p.stderr
    assert "Traceback" not in p.stderr
    p = pyspec_cli("generate", "--target", tiny_target, "--prompt", "x", "--temperature", "-2")
    assert p.returncode == 1 and "temperature" in p.stderr


def test_generate_penalty_flags_reach_the_target(tiny_target: str, tiny_drafts: dict[str, str]) -> None:
    """--logit-bias, --presence-penalty, --frequency-penalty and --repetition-penalty change the
    greedy output as the same GenerationConfig fields do through the library."""
    from pyspec import Engine

    prompt = "def f():"
    base = ["generate", "--target", tiny_target, "--draft", tiny_drafts["perturbed"], "--prompt", prompt,
            "--max-tokens", "16", "--method", "chain", "--n-draft", "3", "--json"]
    plain = json.loads(pyspec_cli(*base).stdout)["tokens"]
    favourite = plain[0] + 1
    biased = pyspec_cli(*base, "--logit-bias", f"{favourite}=100", "--logit-bias", f"{plain[0]}=-5")
    assert biased.returncode == 0, biased.stderr
    assert json.loads(biased.stdout)["tokens"] == [favourite] * 16
    flags = ["--presence-penalty", "0.8", "--frequency-penalty", "0.4", "--repetition-penalty", "1.3"]
    penalised = pyspec_cli(*base, *flags)
    assert penalised.returncode == 0, penalised.stderr
    with Engine(tiny_target) as engine:
        expected = engine.generate(prompt, max_tokens=16, method="none", presence_penalty=0.8, frequency_penalty=0.4,
                                   repetition_penalty=1.3).tokens
    assert json.loads(penalised.stdout)["tokens"] == expected != plain
    bad = pyspec_cli(*base, "--logit-bias", "7:1.5")
    assert bad.returncode == 2 and "--logit-bias" in bad.stderr and "TOKEN=BIAS" in bad.stderr
    out_of_range = pyspec_cli(*base, "--presence-penalty", "3")
    assert out_of_range.returncode == 1 and "presence_penalty" in out_of_range.stderr


class _EngineMade(Exception):
    """Raised by a recording Engine once it has the keyword arguments a command passed."""


@pytest.mark.parametrize("command", ["generate", "calibrate", "bench", "serve", "demo"])
def test_repack_and_huge_pages_reach_the_engine(command: str, tiny_target: str, tiny_drafts: dict[str, str],
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """Each command that loads an engine hands --repack, --no-huge-pages and --flash-attn to
    Engine (serve through ServerSettings), and leaves Engine's defaults without them."""
    import pyspec.engine
    import pyspec.server.app
    from pyspec.cli.main import main

    made: list[dict] = []

    class Recording:
        def __init__(self, *args: object, **kwargs: object) -> None:
            made.append(kwargs)
            raise _EngineMade

    monkeypatch.setattr(pyspec.engine, "Engine", Recording)
    monkeypatch.setattr(pyspec.server.app, "Engine", Recording)
    monkeypatch.setattr("uvicorn.Server.run", lambda server: pyspec.server.app._start(server.config.app.state.settings,
                                                                                    None))

    def settings_app(settings: object) -> object:
        class App:
            class state:
                pass
        App.state.settings = settings
        return App

    monkeypatch.setattr(pyspec.server, "create_app", settings_app)
    prompt = types.SimpleNamespace(id="HumanEval/0", messages=[{"role": "user", "content": "x"}])
    monkeypatch.setattr("pyspec.data.load_suite", lambda suite, n=None: [prompt] * (n or 1))
    argv = {"generate": ["generate", "--target", tiny_target, "--prompt", "x"],
            "calibrate": ["calibrate", "--target", tiny_target, "--draft", ""],
            "bench": ["bench", "--target", tiny_target, "--draft", tiny_drafts["perturbed"], "--methods", "none",
                      "--no-progress"],
            "serve": ["serve", "--target", tiny_target],
            "demo": ["demo", "--target", tiny_target, "--draft", tiny_drafts["perturbed"]]}[command]
    for extra, expected in (([], (None, True, None)),
                            (["--repack", "off", "--no-huge-pages", "--flash-attn"], ("off", False, "on")),
                            (["--flash-attn", "auto"], (None, True, "auto")),
                            (["--flash-attn", "off"], (None, True, "off"))):
        with pytest.raises(_EngineMade):
            main([*argv, *extra])
        assert (made[-1]["repack"], made[-1]["huge_pages"], made[-1]["flash_attn"]) == expected
    if command not in ("calibrate", "demo"):  # --ngram: the commands that serve users with auto
        assert made[-1].get("ngram") is None
        with pytest.raises(_EngineMade):
            main([*argv, "--ngram", "table.ngram"])
        assert made[-1]["ngram"] == "table.ngram"
    with pytest.raises(SystemExit):
        build_parser().parse_args([*argv, "--repack", "amx"])


def test_demo_table_marks_divergence() -> None:
    plain = DemoRun("none", [1, 2, 3], "abc", 10.0, 0.0, 1.0)
    good = DemoRun("chain", [1, 2, 3], "abc", 15.0, 0.8, 2.5)
    bad = DemoRun("lookup", [1, 2, 4], "abd", 20.0, 0.5, 1.5)
    table = format_table([plain, good, bad])
    assert "| chain | 3 | 15.0 | 1.50x | 0.80 | 2.50 | yes |" in table
    assert "| lookup | 3 | 20.0 | 2.00x | 0.50 | 1.50 | NO |" in table


def test_demo_default_methods_run_without_a_head(tiny_target: str, tiny_drafts: dict[str, str]) -> None:
    """`pyspec demo` runs every default method on an engine with a draft and no head: the head's
    method is not among them (it used to be, and the README's main command failed on it)."""
    from pyspec import Engine
    from pyspec.demo import default_methods

    methods = default_methods()
    assert "auto" in methods and "chain" in methods and "none" not in methods and "redrafter" not in methods
    with Engine(tiny_target, draft=tiny_drafts["perturbed"], n_threads=1) as engine:
        for m in methods:
            assert len(engine.generate("def f():", max_tokens=6, method=m).tokens) > 0, m


def test_serve_online_flags_reach_the_training_settings() -> None:
    """pyspec serve --online-*: the flags become OnlineSettings and, through them, the
    distiller's DistillConfig (train_vocab, train_blocks, lr, threads); no --online: None."""
    from pyspec.online.config import DistillConfig
    from pyspec.cli.serve import online_settings

    base = ["serve", "--target", "t.gguf", "--draft", "d.gguf"]
    assert online_settings(build_parser().parse_args(base)) is None
    settings = online_settings(build_parser().parse_args(
        [*base, "--online", "--online-interval", "5", "--online-lr", "3e-5", "--online-train-threads", "2",
         "--no-online-train-vocab", "--online-train-blocks", "4"]))
    assert settings is not None and settings.update_interval == 5
    config = settings.distill_config()
    assert (config.lr, config.train_threads, config.train_vocab, config.train_blocks) == (3e-5, 2, False, 4)
    defaults = online_settings(build_parser().parse_args([*base, "--online"])).distill_config()
    assert (defaults.train_vocab, defaults.train_blocks) == (DistillConfig.train_vocab, DistillConfig.train_blocks)


@pytest.mark.parametrize("flag, value", [("--stats-save-interval", "0"), ("--pool-save-interval", "-5"),
                                         ("--stats-save-interval", "soon"), ("--pool-save-interval", "nan")])
def test_serve_refuses_a_save_interval_that_is_not_positive(flag: str, value: str, tiny_target: str,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    """A bad interval is refused by the command line, naming the flag, before any model loads."""
    from pyspec.cli.main import main

    with pytest.raises(SystemExit) as exit_info:
        main(["serve", "--target", tiny_target, flag, value])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert flag in err and value in err


def test_train_head_preset_fills_what_the_command_line_left_unset(monkeypatch: pytest.MonkeyPatch) -> None:
    """pyspec train-head --preset eagle: its settings where no option was given, the options given
    over them, the built-in defaults without a preset; bf16 follows the CPU's bfloat16 units."""
    import pyspec.cli.train_head as train_head

    base = ["train-head", "--data", "d", "--out", "h.gguf"]
    plain = build_parser().parse_args(base)
    train_head.apply_preset(plain)
    assert (plain.arch, plain.reference, plain.prompts, plain.kept_vocab, plain.depth, plain.epochs, plain.bf16) == (
        "redrafter", False, None, 16384, 5, 3.0, False)
    for has_bf16 in (True, False):
        monkeypatch.setattr(train_head, "cpu_has_bf16", lambda: has_bf16)
        preset = build_parser().parse_args([*base, "--preset", "eagle"])
        train_head.apply_preset(preset)
        assert (preset.arch, preset.reference, preset.depth, preset.kept_vocab, preset.bf16) == (
            "eagle", True, 4, 16384, has_bf16)
        assert preset.prompts == train_head.PRESETS["eagle"]["prompts"]
    given = build_parser().parse_args([*base, "--preset", "eagle", "--depth", "5", "--no-bf16", "--epochs", "1",
                                       "--prompts", "gsm8k[0:3]"])
    train_head.apply_preset(given)
    assert (given.arch, given.depth, given.bf16, given.epochs, given.prompts) == ("eagle", 5, False, 1.0, ["gsm8k[0:3]"])
