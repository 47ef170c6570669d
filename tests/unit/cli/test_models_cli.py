"""``--model`` as users pass it: Hub ids, real config files, and the wrong things (real processes).

Every bad input is one stderr line that names ``--model`` and the fix, exit status 2, never a
traceback. The unusual files are real (tests/fixtures/models/README.md gives their sources).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.procs import dssup_cli

FIXTURES = Path(__file__).parents[2] / "fixtures" / "models"


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return dssup_cli(*args, timeout=120)


def test_hub_id_from_the_registry_any_case() -> None:
    out = run("estimate", "--model", "META-LLAMA/meta-llama-3-70b", "--gpus", "64", "--tp", "8",
              "--pp", "2", "--global-batch-size", "512", "--zero", "1", "--json")  # fmt: skip
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["model"] == "meta-llama/Meta-Llama-3-70B"
    assert any(a.startswith("architecture: GQA 64 query / 8 KV heads") for a in doc["assumptions"])


def test_models_lists_ids_presets_and_types() -> None:
    out = run("models", "--json")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    ids = {m["id"] for m in doc["models"]}
    assert {"meta-llama/Meta-Llama-3-70B", "deepseek-ai/DeepSeek-V3", "microsoft/phi-2"} <= ids
    assert "deepseek-v3" in doc["presets"] and "gemma2" in doc["model_types"]
    phi1 = next(m for m in doc["models"] if m["id"] == "microsoft/phi-1")
    assert phi1["params"] == 1_414_562_935 and phi1["source"] == "copy"
    table = run("models")
    assert table.returncode == 0 and "meta-llama/Llama-3.2-1B" in table.stdout


def test_approximation_is_opt_in_and_printed() -> None:
    kimi = str(FIXTURES / "moonshotai--Kimi-K2-Instruct.json")
    refused = run("estimate", "--model", kimi)
    assert refused.returncode == 2
    assert "model_type 'kimi_k2' is not one dssup reads exactly" in refused.stderr
    out = run("estimate", "--model", kimi, "--approximate-as", "deepseek_v3", "--tp", "8",
              "--ep", "8", "--dp", "8", "--seq-len", "1024", "--json")  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert any(
        a.startswith("APPROXIMATION: model_type 'kimi_k2'")
        for a in json.loads(out.stdout)["assumptions"]
    )


def _bad_inputs(tmp: Path) -> list[tuple[list[str], str]]:
    weights = tmp / "model.safetensors"
    weights.write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{}\x00\x01\x02" * 64)
    array = tmp / "array.json"
    array.write_text("[1, 2, 3]")
    broken = tmp / "broken.json"
    broken.write_text('{"model_type": "llama",')
    return [
        (["--model", str(weights)], f"--model: {weights} is a binary file, not a JSON config"),
        (["--model", str(array)], "holds a JSON list, not a config"),
        (["--model", str(broken)], "is not valid JSON"),
        (
            ["--model", str(FIXTURES / "openai-community--gpt2-generation_config.json")],
            "is not a model config.json (it has _from_model_config, bos_token_id",
        ),
        (
            ["--model", str(FIXTURES / "deepseek-inference-config_671B.json")],
            "DeepSeek's own inference config",
        ),
        (
            ["--model", str(FIXTURES / "microsoft--phi-2-mixformer.json")],
            "model_type 'mixformer-sequential' is not one dssup reads exactly; known: deepseek_v2",
        ),
        (["--model", "meta-llama/Meta-Llama-3-70b-instruct"], "did you mean"),
        (["--model", "nope"], "--model: 'nope' is neither a file nor a model dssup knows"),
        (
            ["--model", "llama-3-8b", "--approximate-as", "llama"],
            "--approximate-as: presets are read exactly; drop --approximate-as",
        ),
        (
            [
                "--model",
                str(FIXTURES / "moonshotai--Kimi-K2-Instruct.json"),
                "--approximate-as",
                "kimi",
            ],
            "--approximate-as: 'kimi' is not a family dssup reads",
        ),
    ]


@pytest.mark.parametrize("case", range(10))
def test_bad_model_input_is_one_line(tmp_path: Path, case: int) -> None:
    args, needle = _bad_inputs(tmp_path)[case]
    out = run("estimate", *args)
    assert out.returncode == 2, (out.stdout, out.stderr)
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in out.stderr, out.stderr
    assert needle in lines[0], lines[0]
    assert "--model" in lines[0] or "--approximate-as" in lines[0]
