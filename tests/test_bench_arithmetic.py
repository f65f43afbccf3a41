"""Benchmarks' own arithmetic: the rollout benchmark's fixed peak (the CPU's documented FP32 FLOPs a
cycle, a denominator for the MFU that does not move with the machine's load), and the fitted growth
of a step's cost against the sessions held."""

from benchmarks.rollout import cpu_peak_flops


def _info(vendor: str, family: int, model: int, flags: str, mhz: str = "2600.000") -> str:
    return (f"processor\t: 0\nvendor_id\t: {vendor}\ncpu family\t: {family}\nmodel\t\t: {model}\n"
            f"cpu MHz\t\t: {mhz}\nflags\t\t: fpu sse sse2 {flags}\n\nprocessor\t: 1\n")


def test_zen4_counts_its_avx512_as_two_256_bit_halves() -> None:
    peak = cpu_peak_flops(_info("AuthenticAMD", 25, 17, "avx fma avx2 avx512f avx512bw"), cores=2)
    assert (peak["isa"], peak["flops_per_cycle"], peak["ghz"]) == ("avx2+fma", 32, 2.6)
    assert peak["flops"] == 2 * 2.6e9 * 32


def test_intel_avx512_has_two_512_bit_fma_units() -> None:
    peak = cpu_peak_flops(_info("GenuineIntel", 6, 85, "avx fma avx2 avx512f", "3000.000"), cores=1)
    assert (peak["isa"], peak["flops_per_cycle"]) == ("avx512", 64) and peak["flops"] == 3e9 * 64


def test_zen1_and_older_vector_units() -> None:
    assert cpu_peak_flops(_info("AuthenticAMD", 23, 1, "avx fma avx2"), cores=1)["flops_per_cycle"] == 16
    assert cpu_peak_flops(_info("AuthenticAMD", 23, 0x31, "avx fma avx2"), cores=1)["flops_per_cycle"] == 32
    assert cpu_peak_flops(_info("GenuineIntel", 6, 42, "avx"), cores=1)["isa"] == "avx"
    assert cpu_peak_flops(_info("GenuineIntel", 6, 23, ""), cores=1)["flops_per_cycle"] == 8


def test_no_cpuinfo_gives_no_peak_rather_than_a_wrong_one() -> None:
    assert cpu_peak_flops("", cores=2)["flops"] == 0


def test_the_growth_exponent_reads_flat_linear_and_quadratic() -> None:
    from benchmarks.sessions_growth import growth_exponent

    xs = [100.0, 250.0, 500.0, 1000.0, 2000.0]
    assert abs(growth_exponent(xs, [7.0] * 5)) < 1e-9
    assert abs(growth_exponent(xs, [x * 3 for x in xs]) - 1) < 1e-9
    assert abs(growth_exponent(xs, [x * x for x in xs]) - 2) < 1e-9


def test_sessions_growth_holds_every_session_and_reports_each_level() -> None:
    from benchmarks.sessions_growth import bench_sessions

    out = bench_sessions(levels=(4, 16), rounds=2)
    assert set(out["sessions_local_step_us"]) == {"4", "16"}
    assert out["sessions_local_step_many_us_vs_4_ratio"]["4"] == 1.0
    assert isinstance(out["sessions_local_step_us_growth_exponent"], float)
