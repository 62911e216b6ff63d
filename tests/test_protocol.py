"""Protocols: waveforms, segments, the standard set and protocol files."""

import numpy as np
import pytest

from kingen.errors import KingenError
from kingen.experiment.protocol import (
    STANDARD_DOSES_MM,
    STANDARD_RECOVERY_INTERVALS_MS,
    Pulse,
    Sweep,
    Transient,
    load_protocol,
    standard_protocol,
)


def test_standard_set_matches_the_field_conventions():
    d = standard_protocol("deactivation")
    assert d.sweeps[0].pulses[0].duration == 1.0 and d.sweeps[0].pulses[0].concentration == 10
    s = standard_protocol("desensitization")
    assert s.sweeps[0].pulses[0].duration == 100.0
    r = standard_protocol("recovery")
    assert tuple(r.x_values()) == STANDARD_RECOVERY_INTERVALS_MS
    for sw, gap in zip(r.sweeps, STANDARD_RECOVERY_INTERVALS_MS):
        first, second = sw.pulses
        assert second.start - first.end == pytest.approx(gap)
        assert first.duration == second.duration == 100.0
    dr = standard_protocol("dose_response")
    assert tuple(dr.x_values()) == STANDARD_DOSES_MM
    with pytest.raises(KingenError, match="unknown protocol"):
        standard_protocol("sensitization")


def test_finite_exchange_has_the_requested_10_90_rise_time():
    sweep = Sweep("x", 10.0, 0.001, pulses=(Pulse(2.0, 5.0, 10.0, rise=0.3, decay=0.3),))
    t = sweep.times()
    c = sweep.concentration(t)
    rise = t[(c >= 9.0)][0] - t[(c >= 1.0)][0]
    assert rise == pytest.approx(0.3, abs=2e-3)
    assert c[np.searchsorted(t, 2.0)] == pytest.approx(5.0, abs=0.05)
    ideal = Sweep("y", 10.0, 0.001, pulses=(Pulse(2.0, 5.0, 10.0),))
    assert set(np.unique(ideal.concentration(t))) == {0.0, 10.0}


def test_segments_cover_the_sweep_and_are_constant_where_they_say():
    sweep = standard_protocol("recovery", exchange=0.2).sweeps[3]
    segs = sweep.segments()
    assert segs[0].start == 0.0 and segs[-1].end == sweep.duration
    for a, b in zip(segs[:-1], segs[1:]):
        assert a.end == pytest.approx(b.start)
    for seg in segs:
        if not seg.smooth:
            t = np.linspace(seg.start, seg.end, 50)[1:-1]
            np.testing.assert_array_equal(sweep.concentration(t), seg.concentration)
    assert sum(s.smooth for s in segs) == 4  # two pulses, two edges each


def test_protocol_file_paired_dose_and_errors(tmp_path):
    f = tmp_path / "paired.toml"
    f.write_text("""
[protocol]
name = "pp"
dt = 0.05
exchange = 0.1
[units]
time = "ms"
concentration = "uM"
[paired]
start = 1
duration = 2
concentration = 1000
intervals = [3, 6]
""")
    p = load_protocol(f)
    assert p.kind == "recovery" and p.n_sweeps == 2
    assert p.sweeps[0].pulses[0].concentration == pytest.approx(1.0)
    assert p.sweeps[1].pulses[1].start == pytest.approx(1 + 2 + 6)
    assert p.sweeps[0].pulses[0].rise == pytest.approx(0.1)
    bad = tmp_path / "bad.toml"
    bad.write_text("[protocol]\ndt = -1\n[dose]\nstart=1\nduration=1\nconcentrations=[1]\n")
    with pytest.raises(KingenError, match=r"bad.toml: protocol.dt = -1(\.0)?: must be > 0"):
        load_protocol(bad)
    empty = tmp_path / "empty.toml"
    empty.write_text("[protocol]\nname='x'\n")
    with pytest.raises(KingenError, match="no sweeps"):
        load_protocol(empty)
    with pytest.raises(KingenError, match="protocol file not found"):
        load_protocol(tmp_path / "missing.toml")


def test_train_protocol_file(tmp_path):
    f = tmp_path / "train.toml"
    f.write_text("[train]\nstart = 2\nduration = 1\nconcentration = 1\nn = 5\nfrequency = 100\n")
    p = load_protocol(f)
    starts = [pl.start for pl in p.sweeps[0].pulses]
    np.testing.assert_allclose(starts, [2, 12, 22, 32, 42])


def _as_solvers_see_it(sweep, t):
    """Concentration as the solvers evaluate it: ideal steps at each segment's midpoint."""
    out = np.full_like(t, np.nan)
    for seg in sweep.segments():
        inside = (t > seg.start + 1e-9) & (t < seg.end - 1e-9)
        out[inside] = sweep.concentration(t[inside], steps_at=0.5 * (seg.start + seg.end))
    return out


@pytest.mark.parametrize("sweep", [
    # an ideal pulse during a synaptic transient's decay
    Sweep("t", 30.0, 0.02, pulses=(Pulse(5.0, 2.0, 10.0),),
          transients=(Transient(1.0, 0.1, 1.0),)),
    # an ideal decay inside the smooth span of a finite rise
    Sweep("r", 3.0, 0.01, pulses=(Pulse(1.0, 0.1, 10.0, rise=0.2, decay=0.0),)),
], ids=["pulse-in-transient", "ideal-decay-in-rise-edge"])
def test_smooth_segments_are_not_merged_across_ideal_steps(sweep):
    t = np.linspace(0.0, sweep.duration, 20001)
    seen = _as_solvers_see_it(sweep, t)
    inside = np.isfinite(seen)  # segment boundaries themselves are left out
    assert inside.sum() > 19000
    np.testing.assert_allclose(seen[inside], sweep.concentration(t[inside]), atol=1e-12)


def test_no_sample_lies_beyond_the_sweep():
    for duration in (10.015, 10.01, 10.0, 47.03, 30.0):
        s = Sweep("x", duration, 0.02)
        assert s.times()[-1] <= duration + 1e-9
        assert s.times()[-1] > duration - 0.02


def test_standard_protocol_rejects_bad_dt_and_exchange():
    with pytest.raises(KingenError, match="dt = 0"):
        standard_protocol("deactivation", dt=0.0)
    with pytest.raises(KingenError, match="dt = -0.02"):
        standard_protocol("deactivation", dt=-0.02)
    with pytest.raises(KingenError, match="exchange = -1"):
        standard_protocol("deactivation", exchange=-1.0)


def test_sweep_x_is_validated_and_converted_to_internal_units(tmp_path):
    f = tmp_path / "x.toml"
    body = """
[protocol]
kind = "recovery"
dt = 0.00002
[units]
time = "s"
[[sweeps]]
duration = 0.05
x = {x}
pulses = [{{start = 0.002, duration = 0.01, concentration = 10}},
          {{start = 0.022, duration = 0.01, concentration = 10}}]
"""
    f.write_text(body.format(x="0.01"))
    assert load_protocol(f).sweeps[0].x == pytest.approx(10.0)  # ms
    f.write_text(body.format(x='"ten"'))
    with pytest.raises(KingenError, match=r"sweeps\[0\]\.x = 'ten': must be a number"):
        load_protocol(f)


PULSE = "pulses = [{start = 2, duration = 1, concentration = 10}]"


@pytest.mark.parametrize("body, where, hint", [
    (f'[[sweeps]]\nlabel = "a"\nduration = 20\n{PULSE}\n'
     f'[[sweeps]]\nlabel = "a"\nduration = 30\n{PULSE}\n',
     "sweeps[1].label = 'a': duplicate sweep label 'a' (also that of sweeps[0].label)",
     "give sweeps[1] another label"),
    # a sweep without a label is labelled by its index
    (f'[[sweeps]]\nduration = 20\n{PULSE}\n[[sweeps]]\nlabel = "0"\nduration = 30\n{PULSE}\n',
     "sweeps[1].label = '0': duplicate sweep label '0' (also that of sweeps[0], labelled by "
     "its index)", "give sweeps[1] another label"),
    ("[paired]\nstart = 2\nduration = 10\nconcentration = 1\nintervals = [5]\n"
     "[dose]\nstart = 2\nduration = 10\nconcentrations = [5]\n",
     "dose.concentrations[0] = 5: duplicate sweep label '5' (also that of "
     "paired.intervals[0])", "put the two series in protocols of their own"),
])
def test_repeated_sweep_labels_are_refused_in_one_line(tmp_path, body, where, hint):
    f = tmp_path / "dup.toml"
    f.write_text("[protocol]\nname = 'dup'\n" + body)
    with pytest.raises(KingenError) as exc:
        load_protocol(f)
    text = str(exc.value)
    assert "\n" not in text
    assert text.startswith(f"{f}: {where}; every sweep needs its own label")
    assert hint in text


def test_generated_labels_of_different_numbers_differ(tmp_path):
    f = tmp_path / "near.toml"
    f.write_text("[paired]\nstart = 2\nduration = 10\nconcentration = 1\n"
                 "intervals = [5, 5.0000001, 5.0000002, 0.25, 1e-7, 0.33333333]\n")
    # 6 significant digits, as before, but in full where two numbers would share a label
    assert [s.label for s in load_protocol(f).sweeps] == [
        "5", "5.0000001", "5.0000002", "0.25", "1e-07", "0.333333"]


@pytest.mark.parametrize("body, labels, xs", [
    # a control dose repeated at the end keeps its place, under a label of its own
    ("[dose]\nstart = 2\nduration = 10\nconcentrations = [0.03, 0.1, 1, 0.03, 0.030]\n",
     ["0.03", "0.1", "1", "0.03_2", "0.03_3"], [0.03, 0.1, 1.0, 0.03, 0.03]),
    ("[paired]\nstart = 2\nduration = 10\nconcentration = 1\nintervals = [5, 20, 5]\n",
     ["5", "20", "5_2"], [5.0, 20.0, 5.0]),
])
def test_a_value_listed_again_in_a_series_gets_a_label_of_its_own(tmp_path, body, labels, xs):
    f = tmp_path / "again.toml"
    f.write_text(body)
    sweeps = load_protocol(f).sweeps
    assert [s.label for s in sweeps] == labels
    assert [s.x for s in sweeps] == pytest.approx(xs)


@pytest.mark.parametrize("label", ['""', '"  "', '"a\\nb"', '"a\\rb"', '"a\\u2028b"',
                                   '"a\\tb"'])
def test_a_blank_or_multiline_sweep_label_is_refused(tmp_path, label):
    f = tmp_path / "label.toml"
    f.write_text(f"[[sweeps]]\nlabel = {label}\nduration = 20\n{PULSE}\n")
    with pytest.raises(KingenError, match=r"sweeps\[0\]\.label = .*: must be a non-empty "
                       r"label without control characters \(tabs, line breaks\)"):
        load_protocol(f)


def test_a_label_with_a_no_break_space_is_taken(tmp_path):
    f = tmp_path / "label.toml"
    f.write_text(f'[[sweeps]]\nlabel = "10\u00a0µM"\nduration = 20\n{PULSE}\n')
    assert load_protocol(f).sweeps[0].label == "10\u00a0µM"
