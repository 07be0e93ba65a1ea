"""Host memory in the memory plan: the process's own cgroup limits, less reclaimable page cache,
and the plan of a decode shared by several ranks (the window group, the gathered tiles, the host's ranks)."""

from __future__ import annotations

from pathlib import Path

import torch

from minimax_h3_vae import H3DecoderConfig, memory

MIB = 2**20
GIB = 2**30

# ---- the cgroup limits of this process, less reclaimable page cache ------------------------------------------------


def fake_machine(root: Path, cgroup: str, files: dict[str, str | int], available_gib: int = 22) -> Path:
    """A folder standing for / : /proc/meminfo (MemAvailable), /proc/self/cgroup, and cgroup files."""
    (root / "proc/self").mkdir(parents=True)
    (root / "proc/meminfo").write_text(f"MemTotal: 32000000 kB\nMemAvailable: {available_gib * 2**20} kB\n")
    (root / "proc/self/cgroup").write_text(cgroup)
    for name, value in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"{value}\n")
    return root


def v2_stat(inactive: int, active: int = 0) -> str:
    return f"anon 1000\nfile {inactive + active}\nactive_file {active}\ninactive_file {inactive}\nshmem 0"


def test_v2_own_cgroup_less_its_page_cache(tmp_path):
    """Bug: memory.current counts page cache the kernel reclaims at once (a 714 MiB decode was refused with
    "178.5 MiB is available" while MemAvailable was 22 GB), and only the root cgroup's files were read."""
    scope = "sys/fs/cgroup/user.slice/app.scope"
    root = fake_machine(
        tmp_path,
        "0::/user.slice/app.scope\n",
        {
            f"{scope}/memory.max": GIB,
            f"{scope}/memory.current": 900 * MIB,
            f"{scope}/memory.stat": v2_stat(inactive=700 * MIB, active=50 * MIB),
            "sys/fs/cgroup/memory.max": "max",  # the root cgroup: no limit
        },
    )
    assert memory.available_host(root) == GIB - (900 - 700) * MIB


def test_v2_a_limit_above_the_own_cgroup_counts(tmp_path):
    root = fake_machine(
        tmp_path,
        "0::/user.slice/app.scope\n",
        {
            "sys/fs/cgroup/user.slice/app.scope/memory.max": "max",
            "sys/fs/cgroup/user.slice/app.scope/memory.current": 100 * MIB,
            "sys/fs/cgroup/user.slice/memory.max": 512 * MIB,
            "sys/fs/cgroup/user.slice/memory.current": 400 * MIB,
            "sys/fs/cgroup/user.slice/memory.stat": v2_stat(inactive=100 * MIB),
        },
    )
    assert memory.available_host(root) == (512 - 300) * MIB


def test_v1_own_memory_cgroup_less_its_page_cache(tmp_path):
    folder = "sys/fs/cgroup/memory/docker/abc"
    root = fake_machine(
        tmp_path,
        "12:pids:/docker/abc\n4:cpu,memory:/docker/abc\n0::/\n",
        {
            f"{folder}/memory.limit_in_bytes": 2 * GIB,
            f"{folder}/memory.usage_in_bytes": 2 * GIB - 10 * MIB,
            f"{folder}/memory.stat": f"cache 999\ninactive_file 5\ntotal_inactive_file {1000 * MIB}\n",
            "sys/fs/cgroup/memory/memory.limit_in_bytes": 9223372036854771712,  # v1's "no limit"
        },
    )
    assert memory.available_host(root) == 2 * GIB - (2 * GIB - 10 * MIB - 1000 * MIB)


def test_a_cgroup_path_not_visible_here_reads_the_mounted_root(tmp_path):
    """A container without its own cgroup namespace: /proc/self/cgroup names the host's path, and the
    container's own cgroup is what is mounted."""
    root = fake_machine(
        tmp_path,
        "0::/system.slice/docker-1234.scope\n",
        {
            "sys/fs/cgroup/memory.max": 3 * GIB,
            "sys/fs/cgroup/memory.current": GIB,
            "sys/fs/cgroup/memory.stat": v2_stat(inactive=0),
        },
    )
    assert memory.available_host(root) == 2 * GIB


def test_usage_over_the_limit_is_no_memory_not_a_negative_size(tmp_path):
    """Bug: usage over the limit printed a negative size."""
    root = fake_machine(
        tmp_path,
        "0::/\n",
        {
            "sys/fs/cgroup/memory.max": GIB,
            "sys/fs/cgroup/memory.current": 2 * GIB,
            "sys/fs/cgroup/memory.stat": v2_stat(inactive=0),
        },
    )
    assert memory.available_host(root) == 0


def test_no_cgroup_limit_leaves_mem_available(tmp_path):
    root = fake_machine(tmp_path, "0::/\n", {"sys/fs/cgroup/memory.max": "max"}, available_gib=3)
    assert memory.available_host(root) == 3 * GIB


# ---- the plan of a decode shared by ranks --------------------------------------------------------------------------

TINY = H3DecoderConfig(num_layers=2, num_heads=2)
SHAPE = (24, 37, 1, 29)  # 7 windows of 3 tiles (16 x 464 px frames, tiles of 16 x 256 px)


def plan(**kwargs) -> memory.MemoryPlan:
    return memory.plan(TINY, SHAPE, dtype=torch.float32, device_type="cuda", **kwargs)


def test_a_rank_plans_the_window_group_it_holds_by_hand():
    """Bug: under torch.distributed the plan counted one window while each rank decodes a group of up to N
    windows and the output rank holds the gathered group (planned 740 MiB for any N, rank 0 peaked at
    1755 MiB with N = 7). With 3 tiles a window on 7 ranks the group is all 7 windows, 3 tiles per rank."""
    latent_tile = 24 * 7 * 1 * 16 * 4  # 7 latent frames of 1 x 16 latents per tile, float32
    decoded_tile = 3 * 28 * 16 * 256 * 4  # 28 frames of 16 x 256 px
    stitched = 3 * 28 * 16 * 464 * 4
    one = plan(tile_batch=1)
    assert (one.windows, one.decoded_tiles) == (1, 3)
    assert one.group == one.window == 3 * (latent_tile + decoded_tile) + 2 * stitched
    output = plan(tile_batch=1, ranks=7, output_rank=0, rank=0)
    other = plan(tile_batch=1, ranks=7, output_rank=0, rank=3)
    assert output.windows == other.windows == 7 and output.decoded_tiles == other.decoded_tiles == 3
    # Every rank: the group's 21 latent tiles, its 3 decoded tiles and their padded copy.
    assert other.group == 21 * latent_tile + 2 * 3 * decoded_tile
    # The output rank also: the 7 shares gathered (21 tiles), joined (21 more), and 7 + 1 stitched windows.
    assert output.group == other.group + (21 + 21) * decoded_tile + 8 * stitched
    assert output.device - one.device == output.group - one.group
    assert other.frames_out == 0 and other.host_frames == 0, "only the output rank converts and writes"


def test_every_rank_receiving_plans_the_gather_on_every_rank():
    ranks = [plan(tile_batch=1, ranks=7, rank=r) for r in (0, 6)]
    assert ranks[0].group == ranks[1].group == plan(tile_batch=1, ranks=7, output_rank=0).group


def test_the_ranks_of_one_host_share_its_memory():
    """On the CPU every rank holds its own weights and buffers in the one host memory: the plan counts them
    all, the same total on every rank of the host."""
    config, shape = H3DecoderConfig(), (24, 72, 48, 84)
    kwargs = dict(dtype=torch.float32, device_type="cpu", tile_batch=4, ranks=4, output_rank=0)
    alone = [memory.plan(config, shape, rank=r, **kwargs) for r in (0, 1)]
    shared = [memory.plan(config, shape, rank=r, host_ranks=4, **kwargs) for r in (0, 1, 3)]
    assert len({p.host for p in shared}) == 1, "every rank of the host plans the same total"
    assert shared[0].host == alone[0].host + 3 * alone[1].host
    weights = sum(memory.weight_bytes(config, torch.float32))
    assert shared[0].host > 4 * weights
    assert shared[1].device == alone[1].device == 0


def test_the_automatic_cpu_tile_batch_takes_this_ranks_share(monkeypatch):
    kwargs = dict(dtype=torch.float32, device_type="cpu", ranks=4)
    alone = memory.plan(H3DecoderConfig(), (24, 7, 48, 84), **kwargs)
    shared = memory.plan(H3DecoderConfig(), (24, 7, 48, 84), host_ranks=4, **kwargs)
    monkeypatch.setattr(memory, "available_host", lambda: 2 * 40 * alone.per_tile)
    cpu = torch.device("cpu")
    assert memory.auto_tile_batch(alone, 28, cpu, None, 0) == 40
    assert memory.auto_tile_batch(shared, 28, cpu, None, 0) == 10
