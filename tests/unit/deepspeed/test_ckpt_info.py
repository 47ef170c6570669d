"""Reading real DeepSpeed checkpoints (tests/fixtures/deepspeed) without torch."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from dssup.supervisor.deepspeed.ckpt_info import (
    find_latest_complete,
    read_checkpoint,
    read_pickled_tree,
)

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "deepspeed"


@pytest.mark.parametrize(("name", "stage"), [("zero0-dp2", 0), ("zero1-dp2", 1), ("zero3-dp2", 3)])
def test_reads_what_it_was_saved_with(name: str, stage: int) -> None:
    info = read_checkpoint(FIXTURES / name)
    assert info is not None
    assert (info.zero_stage, info.dp_world_size, info.mp_world_size) == (stage, 2, 1)
    assert (info.global_steps, info.global_samples, info.tag) == (2, 8, "global_step2")
    assert info.ds_version == "0.19.8" and info.complete and not info.universal
    assert info.ds_config["zero_optimization"] == {"stage": stage}
    same = read_checkpoint(FIXTURES / name / "global_step2")  # the tag dir works too
    assert same == info


def test_package_and_inspection_import_neither_torch_nor_deepspeed() -> None:
    code = (
        "import sys; from pathlib import Path; import dssup.supervisor.deepspeed as ds;"
        "from dssup.supervisor.deepspeed.ckpt_info import read_checkpoint;"
        "assert ds.adapter().name == 'deepspeed';"
        f"i = read_checkpoint(Path({str(FIXTURES / 'zero3-dp2')!r}));"
        "assert i.zero_stage == 3; assert 'torch' not in sys.modules, 'torch imported';"
        "assert 'deepspeed' not in sys.modules, 'deepspeed imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_partial_checkpoint_is_reported_and_skipped(tmp_path: Path) -> None:
    save = tmp_path / "ck"
    shutil.copytree(FIXTURES / "zero1-dp2", save)
    newer = save / "global_step4"
    shutil.copytree(save / "global_step2", newer)
    (newer / "zero_pp_rank_1_mp_rank_00_optim_states.pt").unlink()  # died while saving
    (save / "latest").write_text("global_step4")
    info = read_checkpoint(save)
    assert info is not None and not info.complete
    assert info.missing == ("zero_pp_rank_1_mp_rank_00_optim_states.pt",)
    best = find_latest_complete(save)
    assert best is not None and best.tag == "global_step2" and best.complete


def test_not_a_checkpoint(tmp_path: Path) -> None:
    assert read_checkpoint(tmp_path) is None
    (tmp_path / "latest").write_text("missing_tag")
    assert read_checkpoint(tmp_path) is None
    assert find_latest_complete(tmp_path) is None


def test_unpickling_runs_no_code_from_the_file(tmp_path: Path) -> None:
    import pickle
    import zipfile

    class Evil:
        def __reduce__(self) -> tuple[object, tuple[str]]:
            return (print, ("pwned",))

    path = tmp_path / "mp_rank_00_model_states.pt"
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("archive/data.pkl", pickle.dumps({"x": Evil(), "global_steps": 3}))
    tree = read_pickled_tree(path)
    assert tree["global_steps"] == 3
    assert type(tree["x"]).__name__ == "print"  # an inert stub, never the builtin
