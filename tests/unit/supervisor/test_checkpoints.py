"""Latest complete checkpoint per format; partial ones are never chosen."""

import pytest

from dssup.supervisor.checkpoints import find_latest


def _dcp(root, step, complete=True):
    d = root / f"step_{step:08d}"
    d.mkdir(parents=True)
    (d / "__0_0.distcp").write_bytes(b"x")
    if complete:
        (d / ".metadata").write_bytes(b"m")
    return d


def test_dcp_skips_the_partial_newest(tmp_path):
    _dcp(tmp_path, 2)
    good = _dcp(tmp_path, 4)
    _dcp(tmp_path, 6, complete=False)
    ref = find_latest(tmp_path)
    assert (ref.path, ref.step, ref.format) == (good, 4, "dcp")


def test_hf_checkpoint_needs_trainer_state_and_weights(tmp_path):
    for n, files in (
        (100, ["trainer_state.json", "model.safetensors"]),
        (200, ["model.safetensors"]),
        (300, ["trainer_state.json"]),
    ):
        d = tmp_path / f"checkpoint-{n}"
        d.mkdir()
        for f in files:
            (d / f).write_text("{}")
    ref = find_latest(tmp_path)
    assert (ref.step, ref.format) == (100, "hf")


def _ds_tag(root, tag, shards, stage3=False):
    d = root / tag
    d.mkdir()
    model = "zero_pp_rank_0_mp_rank_00_model_states.pt" if stage3 else "mp_rank_00_model_states.pt"
    (d / model).write_bytes(b"m")
    for r in shards:
        (d / f"bf16_zero_pp_rank_{r}_mp_rank_00_optim_states.pt").write_bytes(b"o")


def test_deepspeed_latest_needs_every_rank_shard(tmp_path):
    _ds_tag(tmp_path, "global_step10", [0, 1])
    _ds_tag(tmp_path, "global_step20", [0])  # rank 1's shard missing: partial
    (tmp_path / "latest").write_text("global_step20")
    ref = find_latest(tmp_path, dp=2)
    assert (ref.path.name, ref.step, ref.format) == ("global_step10", 10, "deepspeed")
    (tmp_path / "global_step20" / "bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt").write_bytes(
        b"o"
    )
    assert find_latest(tmp_path, dp=2).step == 20


def test_user_pattern_and_empty(tmp_path):
    (tmp_path / "ckpt_5.pt").write_bytes(b"x")
    (tmp_path / "ckpt_9.pt").write_bytes(b"")
    assert find_latest(tmp_path, pattern="ckpt_*.pt").step == 5
    assert find_latest(tmp_path / "nope") is None
    assert find_latest(None) is None


def _zip(path, complete=True):
    """What torch.save writes by default: a zip archive; a cut-short one lacks its directory."""
    import zipfile

    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("archive/data.pkl", b"x" * 1000)
    if not complete:
        data = path.read_bytes()
        path.write_bytes(data[: len(data) - 40])


def test_torch_save_files_latest_links_and_cut_short_files(tmp_path):
    _zip(tmp_path / "step-2.pt")
    _zip(tmp_path / "model_4.pt")
    _zip(tmp_path / "step_6.pt", complete=False)  # killed mid-save
    ref = find_latest(tmp_path)
    assert (ref.path.name, ref.step, ref.format) == ("model_4.pt", 4, "torch-save")
    (tmp_path / "latest.pt").symlink_to(tmp_path / "step-2.pt")
    assert find_latest(tmp_path).step == 4


def test_megatron_tracker_and_lightning_checkpoints(tmp_path):
    meg = tmp_path / "meg"
    (meg / "iter_0000100").mkdir(parents=True)
    (meg / "iter_0000200").mkdir()  # being written: the tracker still names 100
    (meg / "latest_checkpointed_iteration.txt").write_text("100")
    ref = find_latest(meg)
    assert (ref.path.name, ref.step, ref.format) == ("iter_0000100", 100, "megatron")
    pl = tmp_path / "pl" / "lightning_logs" / "version_0" / "checkpoints"
    pl.mkdir(parents=True)
    _zip(pl / "epoch=0-step=40.ckpt")
    assert find_latest(tmp_path / "pl").step == 40


def test_an_unrecognised_directory_is_explained_with_the_fix(tmp_path):
    from dssup.supervisor.checkpoints import unrecognised

    (tmp_path / "weights.safetensors").write_bytes(b"x")
    (tmp_path / "optimizer_state").mkdir()
    hint = unrecognised(tmp_path)
    assert hint is not None and "weights.safetensors" in hint
    assert "--checkpoint-pattern" in hint and "step-N.pt" in hint
    assert unrecognised(tmp_path / "missing") is None
    _zip(tmp_path / "step-3.pt")
    assert unrecognised(tmp_path) is None


@pytest.mark.torch
def test_a_real_torch_save_file_and_a_truncated_one(tmp_path):
    torch = pytest.importorskip("torch")
    torch.save({"w": torch.ones(1000)}, tmp_path / "ckpt_7.pt")
    assert find_latest(tmp_path).step == 7
    data = (tmp_path / "ckpt_7.pt").read_bytes()
    (tmp_path / "ckpt_9.pt").write_bytes(data[: len(data) // 2])  # the save was cut short
    assert find_latest(tmp_path).step == 7
