"""tests/harness/run-molecule.sh: each scenario's time by phase, read from Molecule's step lines.

The script's two functions are run alone (its --stamp-phases / --phase-table entry points), on a canned
Molecule log, so no Docker or Molecule is needed.
"""

import os
import subprocess

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(REPO, "tests", "harness", "run-molecule.sh")

ESC = "\x1b"
# Molecule 26's step lines as it prints them coloured (the arrow form) and without colours (the
# bracket form), between lines of Ansible's own output, some of which also say "Executing"
CANNED = "\n".join([
    f"{ESC}[36mINFO    {ESC}[0m {ESC}[1mfailure{ESC}[0m ➜ {ESC}[33mdestroy{ESC}[0m: Executing",
    "PLAY [Destroy] *****",
    f"{ESC}[36mINFO    {ESC}[0m {ESC}[1mfailure{ESC}[0m ➜ {ESC}[33mdestroy{ESC}[0m: Executed: Successful",
    f"{ESC}[36mINFO    {ESC}[0m {ESC}[1mfailure{ESC}[0m ➜ {ESC}[33mcreate{ESC}[0m: Executing",
    "TASK [Executing the deploy] ****",
    "INFO     [failure > converge] Executing",
    "ok: [localhost] => msg: converge: Executing nothing",
    "INFO     failure ➜ idempotence: Executing",
    "INFO     failure ➜ verify: Executing",
    "last line without a newline",
])


def _script(*args, stdin=""):
    proc = subprocess.run(["bash", SCRIPT, *args], input=stdin, capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_stamp_passes_the_output_through_and_marks_each_molecule_step(tmp_path):
    marks = tmp_path / "marks"
    out = _script("--stamp-phases", str(marks), stdin=CANNED)
    assert out == CANNED + "\n"
    steps = [line.split()[1] for line in marks.read_text().splitlines()]
    assert steps == ["destroy", "create", "converge", "idempotence", "verify"]
    stamps = [float(line.split()[0]) for line in marks.read_text().splitlines()]
    assert stamps == sorted(stamps)


def test_phase_table_times_each_step_to_the_next_and_sums_repeated_steps(tmp_path):
    marks = tmp_path / "marks"
    marks.write_text("1000.0 images\n1100.5 destroy\n1102 syntax\n1104 create\n1120 prepare\n"
                     "1125 converge\n1185 idempotence\n1215 verify\n1400 destroy\n1405.25 end\n")
    table = [line.split() for line in _script("--phase-table", str(marks)).splitlines()]
    assert table == [["images", "100.5"], ["destroy", "6.8"], ["syntax", "2.0"], ["create", "16.0"],
                     ["prepare", "5.0"], ["converge", "60.0"], ["idempotence", "30.0"],
                     ["verify", "185.0"]]


def test_phase_table_of_a_scenario_that_ran_no_step_is_empty(tmp_path):
    marks = tmp_path / "marks"
    marks.write_text("1000.0 images\n1010 end\n")
    assert _script("--phase-table", str(marks)).split() == ["images", "10.0"]
    marks.write_text("1010 end\n")
    assert _script("--phase-table", str(marks)) == ""


def test_task_table_sums_each_task_over_its_runs_by_phase_slowest_first(tmp_path):
    marks = tmp_path / "marks"
    marks.write_text("1000 destroy\n1010 converge\n1100 idempotence\n1150 verify\n1400 destroy\n1410 end\n")
    tasks = tmp_path / "tasks"
    # end, seconds, playbook, task, file:line (what tests/harness/callback_plugins/pd_task_times.py writes)
    tasks.write_text("\n".join([
        "1050.0\t30.0\tconverge.yml\tpd.deploy.pd_engine : Wait for health\troles/pd_engine/tasks/main.yml:10",
        "1090.0\t2.5\tconverge.yml\tShow it\tmolecule/x/converge.yml:5",
        "1120.0\t4.0\tconverge.yml\tpd.deploy.pd_engine : Wait for health\troles/pd_engine/tasks/main.yml:10",
        "1200.0\t20.0\tdeploy_pd.yml\tpd.deploy.pd_engine : Wait for health\troles/pd_engine/tasks/main.yml:10",
        "1210.0\t21.25\tdeploy_pd.yml\tpd.deploy.pd_engine : Wait for health\troles/pd_engine/tasks/main.yml:10",
        "1230.0\t80.0\tverify.yml\tRun playbooks/deploy_pd.yml\tmolecule/shared/tasks/nested-playbook.yml:8",
        "a line cut short by a killed run",
        "",
    ]))
    rows = [line.split("\t") for line in
            _script("--task-table", str(marks), str(tasks), "3").splitlines()]
    assert rows == [
        ["80.0", "1", "verify", "verify.yml", "Run playbooks/deploy_pd.yml (molecule/shared/tasks/nested-playbook.yml:8)"],
        ["41.2", "2", "verify", "deploy_pd.yml", "pd.deploy.pd_engine : Wait for health (roles/pd_engine/tasks/main.yml:10)"],
        ["30.0", "1", "converge", "converge.yml", "pd.deploy.pd_engine : Wait for health (roles/pd_engine/tasks/main.yml:10)"],
    ]


def test_task_table_without_task_times_is_empty(tmp_path):
    marks = tmp_path / "marks"
    marks.write_text("1000 destroy\n1010 end\n")
    assert _script("--task-table", str(marks), str(tmp_path / "none"), "10") == ""
