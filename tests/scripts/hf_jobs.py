"""hf_jobs.py OUT JOB...: several checks against transformers in one Python
process. Importing torch and transformers takes about 5 s of a core in each
process, which made up most of test_hf_transformers' 60 s when each check was
a process of its own. A JOB is NAME, a tab, then one of the checkers'
command lines (hf_transformers_logits.py, hf_generate.py, hf_tokenizer.py:
the script's name, then its arguments, tab-separated). Each job's output goes
to OUT/NAME.out and its exit status to OUT/NAME.rc (2: it raised; the
traceback is in the .out), in the order given, so a job may read what an
earlier one wrote."""
import contextlib
import importlib
import os
import sys
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
CHECKERS = {"hf_transformers_logits.py", "hf_generate.py", "hf_tokenizer.py", "hf_packed.py"}


def run(out_dir, job):
    name, script, *args = job.split("\t")
    if script not in CHECKERS:
        raise SystemExit(f"hf_jobs.py: job {name}: unknown checker '{script}' (expected one of {sorted(CHECKERS)})")
    with open(os.path.join(out_dir, name + ".out"), "w") as out, contextlib.redirect_stdout(out):
        try:
            rc = importlib.import_module(script[:-3]).main(args)
        except Exception:
            traceback.print_exc(file=out)
            rc = 2
    with open(os.path.join(out_dir, name + ".rc"), "w") as f:
        f.write(f"{rc}\n")


def main(argv):
    for job in argv[1:]:
        run(argv[0], job)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
