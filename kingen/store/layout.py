"""The run file's layout, as data: the one source of the documentation's page "The run file".

:data:`ENTRIES` names every group, dataset and attribute set of a run file with what it
holds; :data:`INTRO` and :data:`OUTRO` are the prose around that table. :func:`markdown`
renders them as that page, which every run file also carries as its root
attribute ``layout`` (:data:`LAYOUT_DOC`). ``python -m kingen.store.layout`` prints it; a
test checks that the page renders exactly this text.
"""

from __future__ import annotations

from typing import NamedTuple

# 2: every dataset carries a Fletcher-32 checksum; the resume state is plain arrays, not a
# pickle. Version 1 files are refused: resuming one would unpickle what the file holds.
LAYOUT_VERSION = 2
MARKER = "kingen run file"
REQUIRED_GROUPS = ("config", "scheme", "protocols", "data", "targets", "environment",
                   "generations", "hall_of_fame", "best", "resume", "run")
# Every run file has these from its creation (SWMR cannot add objects later), so opening
# refuses a file that lacks one: otherwise a reader meets the gap half-way, or never (a
# plot drawn without its data). Paths are from the root; "<p>" is each protocol's group.
# Not here, because files from earlier kingens lack them: /profiles (kingen profile adds
# the group, whole: PROFILE_DATASETS once it is there) and /run/lost_workers (resume adds
# it); nor the optional parts of a recording and of targets (/data/<p>/concentration_mM,
# /targets/<p>/dose_response and recovery).
REQUIRED_SUBGROUPS = ("best/traces", "resume/slot_0", "resume/slot_1")
REQUIRED_DATASETS = (
    "config/text", "config/settings",
    "scheme/text", "scheme/states", "scheme/parameters", "scheme/transitions",
    "generations/free_mask", "generations/population", "generations/errors",
    "generations/fitness", "generations/fail", "generations/generation", "generations/size",
    "generations/stats", "generations/stats_names", "generations/timings",
    "generations/timings_names",
    "hall_of_fame/params", "hall_of_fame/fitness", "hall_of_fame/size",
    "best/valid", "best/generation", "best/params", "best/fitness", "best/errors",
    "best/amplitudes", "best/features", "best/polish", "best/traces_info",
    "resume/generation", "resume/crc32",
    "run/commit", "run/finished", "run/finished_unix",
)
PROTOCOL_DATASETS = tuple(f"protocols/<p>/{n}" for n in ("sweeps", "pulses", "transients")) + \
    tuple(f"best/traces/<p>/{n}" for n in ("time_ms", "fit_pA", "data_pA", "n_samples"))
# Only for a protocol with a recording (a /data/<p> group) or targets (/targets/<p>).
RECORDING_DATASETS = tuple(f"data/<p>/{n}" for n in ("labels", "n_samples", "time_ms",
                                                      "current_pA"))
TARGET_DATASETS = ("targets/<p>/features",)
PROFILE_DATASETS = ("profiles/local", "profiles/slot_0", "profiles/slot_1", "profiles/commit")
# Attributes the readers take as given (path, attribute); "<p>" as above.
REQUIRED_ATTRIBUTES = (("protocols", "names"), ("generations", "population_size"),
                       ("resume/slot_0", "fields"), ("resume/slot_1", "fields"))
PROTOCOL_ATTRIBUTES = (("protocols/<p>", "name"), ("protocols/<p>", "kind"))
TITLE = "## The run file"


class Entry(NamedTuple):
    """One row of the layout table: a path in the file (markdown), and what it holds."""

    path: str
    contents: str


# The prose before the table (markdown).
INTRO = """\
`kingen fit` writes one HDF5 file per run (`output` in the configuration). It holds everything
needed to understand, plot, export and resume the run, and it explains itself:
- Every dataset of a physical quantity carries its unit (`unit`, or `unit_<column>` for
  tables), and most datasets carry a `description`.
- The root group carries this section as its `layout` attribute.

It is written as the run goes, in HDF5's single-writer/multiple-reader (SWMR) mode:
- `kingen plot` and `kingen report` work on a live run.
- A run killed at any moment, even with SIGKILL, leaves a file that opens and holds every
  completed generation; `kingen resume RUN.h5` continues it.
- A disk that fills up stops the run before a generation is written, with one line
  (`the disk holding the run file is full (2.3 MB free; the next write needs about 2.3
  MB): the run file keeps every committed generation; free some space and go on with
  kingen resume RUN.h5`): HDF5 that runs out of space part-way cannot close its file.
  A disk that fills between that check and HDF5's write (another process writing to it),
  or a quota the check cannot see, is said in one line too (`the disk holding the run file
  filled up while generation 12 was written (HDF5: No space left on device): ...`);
  `kingen resume` then checks the file before it goes on.
  A fit stopped before its first generation was committed leaves no file; with
  `--overwrite`, the earlier run file stays as it was until the new run commits its first
  generation.
- The configuration's `output` is relative to the configuration file, as its other paths
  are; `-o` on the command line is relative to the folder kingen runs in.
- A killed run's file still carries HDF5's "open for writing" flag, so a plain
  `h5py.File(path)` refuses it (kingen and `swmr=True` readers do not). `kingen resume`
  clears the flag (it rebuilds the file from what was committed), and so does HDF5's
  `h5clear -s RUN.h5` (Debian package `hdf5-tools`) without resuming.

It protects itself against damage, and it is data, never code:
- Every dataset is chunked with a Fletcher-32 checksum, which HDF5 checks on every read.
  Scalars are stored as one-element arrays and text as fixed-length UTF-8 strings, so that
  they carry one too. HDF5's own metadata (superblock, object headers, chunk indexes) has
  checksums of its own.
- Opening a run file reads every committed dataset once (`RunStore.open(path,
  verify=False)` skips this, for very large files). So `kingen resume`, `plot`, `report`
  and `export` each stop on a flipped bit with one line such as `run.h5:
  /generations/population: damaged run file: its data fail their Fletcher-32 checksum;
  restore the file from a copy`.
- Opening also checks that the counters agree with the data: the commit against the stored
  rows, the resume slot, row widths, the hall of fame and the sweeps. Attributes carry no
  checksum, so they are checked against the datasets. So are the contents a checksum does
  not vouch for (an edit rewrites it): the scheme text must be the scheme of
  `/scheme/states`, `/scheme/parameters` and `/scheme/transitions`, the JSON (settings, the
  best candidate's traces metadata) must parse to what kingen writes, and rate constants
  must be > 0.
- The resume state is plain arrays of numbers, read back with type and shape checks. No
  pickle, `eval` or `exec` ever runs on anything a run file holds. Files of layout version 1
  (kingen 0.1) kept it as a Python pickle, which could run code when read. This kingen
  refuses them in one line, for every command, and does not migrate them: run the fit
  again.

To read it from Python, use `kingen.store.RunStore.open(path)`, or any HDF5 tool (h5py,
HDFView, `h5dump`). Open a live run with `h5py.File(path, "r", libver="latest", swmr=True)`,
and trust only the generations counted by `/run/commit`.

Units and notation:
- Parameter values are in kingen's internal units (ms⁻¹ for first-order rates,
  mM⁻¹ ms⁻¹ for binding rates); `/scheme/parameters` also gives them in the scheme file's
  units.
- Times are in ms, concentrations in mM, currents in pA, potentials in mV, conductances in pS.
- Tables are HDF5 compound datasets.
- `P` is the number of rate constants, `R` the number of protocols, `N` the population size
  and `G` the number of generations completed.
"""

# One row per group, dataset or attribute set: (path, what it holds).
ENTRIES: tuple[Entry, ...] = (
    Entry('`/` (attributes)',
          f'`kingen_run = "{MARKER}"` (the marker), `layout_version` ({LAYOUT_VERSION}), '
          '`kingen_version`, `created` (ISO 8601, UTC), `layout` (this text)'),
    Entry('`/config/text`',
          'the configuration file as given (TOML)'),
    Entry('`/config/settings`',
          'the settings it resolved to, defaults filled in (JSON)'),
    Entry('`/scheme/text`',
          'the scheme file as read; `Scheme.loads` rebuilds the scheme from it'),
    Entry('`/scheme` (attributes)',
          '`name`, `source`, `path`, `agonist`, `channels`, `file_units`, '
          '`reversibility_tolerance`'),
    Entry('`/scheme/states`',
          'table: `name`, `conductance` (pS), `initial` (NaN: equilibrium at zero agonist)'),
    Entry('`/scheme/parameters`',
          'table: `name`, `value`, `lower`, `upper`, `unit` (internal), `file_value`, '
          "`file_lower`, `file_upper`, `file_unit` (the scheme file's), `order`, `scale`, "
          '`fixed`, `derived`'),
    Entry('`/scheme/transitions`',
          'table: `source`, `target` (state names), `rate` (expression), `factor`, `param`, '
          '`agonist`, `derived`'),
    Entry('`/protocols` (attribute `names`)',
          'protocol names in error-column order (JSON); one group per protocol, attributes '
          '`name`, `kind`, `source`, and `chain` (JSON: the recording chain, `filter`, '
          '`offset`, `amplitude`; absent: no filter, one amplitude, no offset)'),
    Entry('`/protocols/<p>/sweeps`',
          'table: `label`, `duration`, `dt` (ms), `holding`, `reversal` (mV), `x` (recovery '
          'interval, ms, or dose, mM; NaN if none)'),
    Entry('`/protocols/<p>/pulses`',
          'table: `sweep`, `start`, `duration` (ms), `concentration` (mM), `rise`, `decay` '
          '(10–90 % exchange times, ms)'),
    Entry('`/protocols/<p>/transients`',
          'table: `sweep`, `start` (ms), `peak` (mM), `tau_decay`, `tau_rise` (ms)'),
    Entry('`/data/<p>/`',
          'the recording fitted under protocol `p` (absent if none): `time_ms`, '
          '`current_pA`, `concentration_mM` (optional) as (sweeps × samples) arrays, NaN '
          'padded; `n_samples` per sweep; `labels`; attributes `source`, `holding_mV`, '
          '`meta` (JSON), `labelled` (1: sweeps paired with the protocol\'s by label; 0 or '
          'absent: by label where both sets of labels agree, else by position)'),
    Entry('`/targets/<p>/`',
          'summary targets (absent if none): `features` table (`name`, `value`, `weight`, '
          "`sd`; units from the name's suffix), `dose_response` (`concentration` mM, `peak`, "
          '`ss` pA), `recovery` (`interval` ms, `ratio`)'),
    Entry('`/environment` (attributes)',
          'kingen, Python, NumPy, SciPy, h5py, HDF5, Numba, DEAP versions, platform, device '
          'name, backend, precision'),
    Entry('`/generations/generation`',
          '(G,) generation numbers'),
    Entry('`/generations/population`',
          "(G, N, P) every candidate's parameters (internal units); attribute `columns`"),
    Entry('`/generations/errors`',
          '(G, N, R) error of every candidate under each protocol; attribute `columns`'),
    Entry('`/generations/fitness`',
          "(G, N) fitness, lower is better: Σ weight × χ² over the protocols (runs whose "
          "`/best/polish` has no `objective`: the total weighted relative error)"),
    Entry('`/generations/fail`',
          '(G, N) failure code (0 = simulated fine; −1 = padding)'),
    Entry('`/generations/size`',
          '(G,) candidates in each generation (rows beyond are NaN padding)'),
    Entry('`/generations/stats`, `stats_names`',
          '(G, 32) summary statistics (`best`, `median`, `mean`, `n_failed`, …), column '
          'names in `stats_names`'),
    Entry('`/generations/timings`, `timings_names`',
          '(G, 32) seconds per generation: `total_s`; `solver_s` (of which `kernel_s`, and '
          "the host's `solver_prepare_s` and `solver_finish_s`), `objective_s` (of which "
          '`params_s`, genes to rate constants), `ga_s` (of which `ga_variation_s`, '
          '`ga_hof_s`, `ga_select_s`, `ga_stats_s`), `io_s`; in a sharded fit `dask_s`, '
          '`dask_send_s`, `dask_worker_s`, `dask_return_s`'),
    Entry('`/generations/free_mask`',
          '(P,) true for each rate constant the fit searched; attribute `population_size` on '
          'the group'),
    Entry('`/hall_of_fame/params`, `fitness`, `size`',
          'the best candidates ever seen, best first; the first `size` rows are valid'),
    Entry('`/best/`',
          'the best candidate, valid when `valid` = 1: `params` (P,), `fitness`, `errors` '
          'and `amplitudes` (R,: the number of channels fitted per recording; the fitted '
          'current is amplitude × the one-channel current), `generation`; `features` (JSON: '
          'per protocol, features of the fit and of the data), `polish` (JSON: how the best '
          'was found: `objective` "chi2" with its `noise` model, the refinement\'s χ² '
          'before/after and why it stopped, `updates` by kingen profile; without '
          '`objective`, a run of the weighted relative error)'),
    Entry('`/best/traces/<p>/`',
          "the best candidate's currents: `time_ms`, `fit_pA`, `data_pA` (sweeps × samples, "
          'NaN padded), `n_samples`, and `model_pA` (the fit without the filter) where the '
          "protocol's chain has one; sweep labels, and per-sweep amplitudes and offsets "
          'where the chain fits them, in `/best/traces_info` (JSON)'),
    Entry('`/resume/slot_0`, `slot_1`',
          'the resume state of the last committed generation, in the slot `/run/commit[1]` '
          "names, as plain arrays (attribute `fields` lists them; `shapes` gives each one's "
          'shape): `genes`, `fitness`, `errors`, `fail` (the population), `hof_genes`, '
          '`hof_fitness` (the hall of fame), the counters `generation`, `since_improvement`, '
          "`evaluations`, `best`, `reference`, `elapsed`, `version`; Python's `random` state "
          'as integers (`python_random`: 624 words and the position; '
          '`python_random_version`, `python_random_has_gauss`, `python_random_gauss`); '
          "NumPy's global generator (`np_global_key`, `np_global_pos`, "
          "`np_global_has_gauss`, `np_global_gauss`); the fit's PCG64 (`rng_pcg64`: state "
          'and increment as high and low 64-bit words; `rng_has_uint32`, `rng_uinteger`); '
          'for CMA-ES, the strategy (`cma_centroid`, `cma_sigma`, `cma_pc`, `cma_ps`, '
          '`cma_C`, `cma_B`, `cma_BD`, `cma_diagD`, `cma_cond`, `cma_update_count`, '
          '`cma_lambda_`, `cma_mu`)'),
    Entry('`/resume/generation`, `crc32`',
          '(2,) per slot: the generation it holds, and a CRC-32 of its arrays and shapes, '
          'written last'),
    Entry('`/run/commit`',
          '`[generations committed, resume slot, last generation number]`, written last '
          'after each generation: readers trust only it'),
    Entry('`/run/finished`',
          'why the run stopped, as the fit says it: `maximum generations (40)`, `no '
          'improvement for 15 generations`, `target error 0.01 reached`, `wall-time limit '
          '3600 s`, then the fit\'s summary line, `; converged: …` (stopped on stagnation '
          'or at the target error) or `; not converged: …` (at a maximum, with how much the '
          'best still improved; absent in files written before kingen said it), or `; every '
          'candidate failed` when none simulated; empty while '
          'running or if the run was stopped or killed; '
          '`finished_unix` when; attributes `resumed` (times the run was resumed), '
          '`writer_pid`, `writer_host`'),
    Entry('`/run/lost_workers`',
          'JSON list: one entry per shard of a generation that a lost Dask worker held and '
          'that ran again on another worker (`generation`, `shard`, `rows`, `worker`, '
          '`time`); empty for a fit in one process (see "Scale-out (Dask)")'),
    Entry('`/profiles/local`',
          'local uncertainty at the optimum (JSON; written at the end of a fit and by '
          '`kingen profile`): `names` (free parameters), `best_log10`, `se_log10` (standard '
          'errors in decades; null: not determined), `correlation`, `fisher` (JᵀJ), `chi2`, '
          '`noise` (per protocol: `sigma_pA`, `source` (`baseline` or `residuals`), '
          '`tau_samples`, `n_samples`, `n_eff`, `residual_rms_pA`, `target_scale`, `notes`). '
          'Absent in files written before kingen had it (`kingen profile` adds it)'),
    Entry('`/profiles/slot_0`, `slot_1`, `commit`',
          "`kingen profile`'s whole state (JSON) in the slot `commit[1]` names: `settings`, "
          '`noise`, `names`, `engine` (every sub-problem: profiled gene, grid value, genes, '
          'χ², optimiser state), and once finished `results` (per parameter: `grid`, '
          '`delta_chi2`, `lower`, `upper` (null: open), `flat`, `identifiable`, `pairs`; '
          '`threshold`, `level`, `chi2_min`); `commit` = `[steps, slot, CRC-32 of the '
          "slot's text]`, written last"),
)

# The prose after the table (markdown).
OUTRO = """\
Errors say what is wrong in one line, naming the file (and the dataset or counter, with
its value): a file that is not HDF5, or not a readable one (a damaged superblock), an HDF5
file that is not a kingen run, a truncated file, a damaged dataset, counters that disagree
with the data, a malformed resume state, a file of another layout version, a missing
group, dataset or attribute (named by its HDF5 path), a run file that another process
writes. `kingen plot`, `kingen report` and `kingen export` only read the run file and
write their own outputs through temporary files, so they never leave a half-written file.
"""


def table() -> str:
    """The layout table (markdown), one row per :data:`ENTRIES` item."""
    rows = ["| path | contents |", "|---|---|"]
    rows += [f"| {e.path} | {e.contents} |" for e in ENTRIES]
    return "\n".join(rows) + "\n"


def markdown() -> str:
    """The documentation's page "The run file": title, prose, table, prose."""
    return f"{TITLE}\n\n{INTRO}\n{table()}\n{OUTRO}"


# Stored in every run file (root attribute `layout`): the documentation's page itself.
LAYOUT_DOC = markdown()


if __name__ == "__main__":  # pragma: no cover - prints the documentation's page
    print(markdown(), end="")
