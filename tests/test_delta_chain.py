"""A run's delta chain (`loops.model_dir.delta_chain`): each export-worthy point adds the link
from the export the chain last gave, so export 0 patched by every link is the last export bit
for bit; an export that changes nothing adds none; only the newest link's export is kept to
follow; a kill between keeping an export and writing its link leaves the chain valid and the
next link follows the export its newest link gives."""

import os

import numpy as np
import pytest
from test_export_deltas import exported

from loops.model_dir import delta_chain, export_deltas


def stages(root, count):
    """`count` + 1 exports of one model, each changing two rows of the one before."""
    rng = np.random.default_rng(1)
    table = rng.normal(size=(50, 4)).astype(np.float32)
    kernel = rng.normal(size=4).astype(np.float32)
    paths = []
    for stage in range(count + 1):
        paths.append(exported(root / f"stage{stage}", table, kernel, np.float32(stage)))
        table = table.copy()
        table[[stage, 40 - stage]] += 1.0
    return paths


def test_each_link_follows_the_last_export_and_the_chain_gives_the_newest(tmp_path):
    first, *later = stages(tmp_path, 3)
    chain = delta_chain.DeltaChain(str(tmp_path / "run"), first)
    assert chain.tip() == first
    links = []
    for path in later:
        staging = chain.staging()
        os.rename(path, staging)  # as an export written where `staging` says
        links.append(chain.extend(staging))
        assert chain.tip().endswith(export_deltas.read_delta(links[-1])["gives"])
        assert os.listdir(chain.bases) == [os.path.basename(chain.tip())]  # only the newest
    assert links == [os.path.join(chain.deltas, f"{n:06d}") for n in (1, 2, 3)]
    manifests = [export_deltas.read_delta(link) for link in links]
    assert [m["follows"] for m in manifests[1:]] == [m["gives"] for m in manifests[:-1]]
    assert manifests[0]["follows"] == export_deltas.fingerprint(first)
    # Two rows a stage and the bias: what each link holds of the model.
    assert [sum(v.get("rows", 0) for v in m["variables"].values()) for m in manifests] == [2] * 3
    # The run's export of the last stage (copied, not moved: it stays the run's) adds nothing.
    again = str(tmp_path / "export")
    import shutil

    shutil.copytree(chain.tip(), again)
    assert chain.extend(again) is None and os.path.isdir(again)
    patched = export_deltas.apply_deltas(first, [chain.deltas], str(tmp_path / "patched"))
    assert patched["fingerprint"] == manifests[-1]["gives"]


def test_a_kill_before_a_link_is_written_leaves_the_chain_valid(tmp_path, monkeypatch):
    first, second, third = stages(tmp_path, 2)
    chain = delta_chain.DeltaChain(str(tmp_path / "run"), first)
    chain.extend(second)
    tip = chain.tip()

    def killed(*_):
        raise OSError("killed while the link was written")

    monkeypatch.setattr(export_deltas, "write_delta", killed)
    with pytest.raises(OSError, match="killed"):
        chain.extend(third)
    monkeypatch.undo()
    # The export it would have given is kept, its link is not: the tip is the one before.
    assert chain.tip() == tip and len(os.listdir(chain.bases)) == 2
    assert len(export_deltas.delta_paths([chain.deltas])) == 1
    link = chain.extend(third)
    assert export_deltas.read_delta(link)["follows"] == os.path.basename(tip)
    assert os.listdir(chain.bases) == [export_deltas.read_delta(link)["gives"]]
    patched = export_deltas.apply_deltas(first, [chain.deltas], str(tmp_path / "patched"))
    assert patched["fingerprint"] == export_deltas.fingerprint(third)
