"""The multimodal benchmark (issue 30) runs both sides in processes of their own and
reports coherent rows (never a timing or memory assertion on this machine)."""

from __future__ import annotations

import pathlib

from fractor.actors import Image
from fractor.benchmarks import multimodal
from fractor.benchmarks._harness import print_rows


def test_the_benchmarks_png_is_an_image_of_its_size() -> None:
    data = multimodal.png(300_000, width=640, height=480)
    image = Image(data=data)
    assert (len(data), image.media_type, image.width, image.height) == (
        300_000,
        "image/png",
        640,
        480,
    )


async def test_a_lead_hands_one_image_to_its_subagents_and_stores_it_once(
    tmp_path: pathlib.Path,
) -> None:
    size = 400_000
    figures = await multimodal.fractor_side(multimodal.png(size), 10, tmp_path / "m.db")
    assert figures["blobs"] == 1
    assert figures["blob_bytes"] == size
    assert figures["image_bytes"] == size
    # Eleven traces and the lead's state, as text: far less than the image.
    assert 0 < figures["text_bytes"] < size / 4
    assert size < figures["file_bytes"] < 1.1 * (size + figures["text_bytes"])
    raw = await multimodal.raw_side(multimodal.png(size), 10)
    assert raw["peak_mib"] > 0


async def test_the_rows_run_each_side_in_its_own_process() -> None:
    rows = await multimodal.run(subagents=5, size=200_000)
    peak, grown, stored = rows
    assert peak.workload == "Multimodal: a 0.2 MB image from a lead to 5 subagents, peak RSS"
    assert peak.unit == stored.unit == "MiB"
    assert peak.fractor > 0
    assert peak.baseline > 0
    assert abs(peak.ratio - peak.baseline / peak.fractor) < 1e-9
    assert peak.holds == (peak.fractor <= 1.2 * peak.baseline + 10)
    assert grown.target.startswith("reported")
    assert 0 < grown.fractor < peak.fractor
    assert stored.fractor > stored.baseline > 200_000 / multimodal.MIB
    assert stored.holds == (stored.fractor <= 1.1 * stored.baseline)
    print_rows(rows)
