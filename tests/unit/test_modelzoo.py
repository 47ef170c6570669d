"""The model registry: shipped files unchanged since their source, ids unique, every entry read.

The catalog names each file's source (repository, path, commit, kind); the SHA-256 recorded
there locks the shipped bytes, so an edit shows up here. Variants that share an architecture
are found by comparing what dssup reads from the real files, not by assuming it.
"""

from __future__ import annotations

import hashlib
from importlib import resources

import pytest

from dssup import modelzoo
from dssup.memory import model_from_hf_config, preset
from dssup.modelio import load_model


def test_files_are_the_recorded_bytes() -> None:
    root = resources.files("dssup.modelzoo").joinpath("configs")
    shipped = {p.name for p in root.iterdir() if p.name.endswith(".json")}
    files = {e.file for e in modelzoo.entries() if e.file}
    assert shipped == files
    for e in modelzoo.entries():
        if e.file:
            data = root.joinpath(e.file).read_bytes()
            assert hashlib.sha256(data).hexdigest() == e.sha256, e.file
            assert len(e.source.commit) == 40 and e.source.repo and e.source.path


def test_ids_are_unique_and_found_in_any_case() -> None:
    ids = [i.lower() for e in modelzoo.entries() for i in e.ids]
    assert len(ids) == len(set(ids))
    e = modelzoo.find("HF://Meta-Llama/Llama-3.1-70B/")
    assert e is not None and e.id == "meta-llama/Meta-Llama-3.1-70B"
    assert modelzoo.find("meta-llama/Llama-4-Behemoth") is None


def test_every_entry_is_read() -> None:
    for e in modelzoo.entries():
        spec = load_model(e.id)
        assert spec.name == e.id
        if e.preset:
            assert spec.model_dump(exclude={"name", "notes"}) == preset(e.preset).model_dump(
                exclude={"name", "notes"}
            )
        kinds = {"copy", "resave", "printed", "transcription", "preset"}
        assert e.source.kind in kinds
        assert (e.source.kind == "transcription") == any("transcription" in n for n in spec.notes)
        assert (e.source.kind == "printed") == any("printed it" in n for n in spec.notes)


def _arch(hub_id: str) -> dict[str, object]:
    entry = modelzoo.find(hub_id)
    assert entry is not None
    return model_from_hf_config(modelzoo.load_config(entry)).model_dump(exclude={"name", "notes"})


@pytest.mark.parametrize(
    "group",
    [
        ["mistralai/Mixtral-8x7B-v0.1", "mistralai/Mixtral-8x7B-Instruct-v0.1"],
        ["Qwen/Qwen2.5-7B", "Qwen/Qwen2.5-7B-Instruct"],
        ["meta-llama/Meta-Llama-3.1-8B", "meta-llama/Llama-3.1-8B-Instruct"],
        [
            "meta-llama/Meta-Llama-3.1-70B",
            "meta-llama/Llama-3.1-70B-Instruct",
            "meta-llama/Llama-3.3-70B-Instruct",
        ],
        ["deepseek-ai/DeepSeek-V3", "deepseek-ai/DeepSeek-R1", "deepseek-ai/DeepSeek-V3.1"],
        ["Qwen/Qwen2.5-32B", "deepseek-ai/DeepSeek-R1-Distill-Qwen-32B"],
        ["meta-llama/Llama-3.2-1B", "meta-llama/Llama-3.2-1B-Instruct"],
        ["meta-llama/Llama-3.2-3B", "meta-llama/Llama-3.2-3B-Instruct"],
        # the legacy-format copies and transformers-format transcriptions of the instruct models
        ["tiiuae/falcon-7b", "tiiuae/falcon-7b-instruct"],
        ["tiiuae/falcon-40b", "tiiuae/falcon-40b-instruct"],
        # two transcriptions (no copy of either file was found)
        ["google/gemma-2-2b", "google/gemma-2-2b-it"],
    ],
)
def test_variants_that_share_an_architecture(group: list[str]) -> None:
    """Base and instruct releases whose configs read to the same model (docs/models.md)."""
    first = _arch(group[0])
    assert all(_arch(i) == first for i in group[1:])


def test_variants_that_differ() -> None:
    """Mixtral-8x22B's instruct release has a larger vocabulary (32768 vs 32000)."""
    base, inst = (
        _arch("mistralai/Mixtral-8x22B-v0.1"),
        _arch("mistralai/Mixtral-8x22B-Instruct-v0.1"),
    )
    assert (base["vocab"], inst["vocab"]) == (32000, 32768)


def test_cli_and_webhook_read_a_registered_model_the_same() -> None:
    """One reading (``dssup.modelio.registered_model``) behind ``--model`` and the webhook's
    Hub-id lookup: the same spec, notes (preset, transcription, printed) included."""
    from dssup.admission.modelid import known_model

    for e in modelzoo.entries():
        for hub in (i for i in e.ids if "/" in i):  # a job's bare "gpt2" may be a path
            hit = known_model(f"hf://{hub}")
            assert hit is not None and hit[1] == e.id, hub
            assert hit[0] == load_model(hub), hub
