"""From the runs' files (results.json, each rank's trace) to the comparison: one CSV row per run
(results.csv); report.md, answers first; projection.md beside it, the projections past this
machine, labelled so. compare.py's write_report lays the pages out; each room here holds one
section of them, or one idea the sections share. Import a name from its room: this file only maps
them.

Read from the ground up: each of the first seven imports only rooms above it; the sections import
those, and no section here another but recommendation.py (it names the model state as
projection_memory.py does).
- outcome.py            what a run came to (Outcome), as comparison/runner.py hands it over
- formatting.py         how a figure is written: mean ± std, per cent, bytes, counts, durations
- files.py              each file written whole or not at all; the pictures' names
- model.py              what the runs trained: the title's model, the `Model: ... Data:` line
- rows.py               each run's results.csv row, and results.csv itself
- measured.py           a configuration's speed, every figure made from one statistic: its step
- noise.py              when two configurations can be told apart: overlap, noise floor, ties,
                        each parallel one against one GPU (faster, a tie, slower)
The sections, as report.md shows them:
- recommendation.py     the `Recommendation:` line, its rules in order
- results_table.py      ## Results: the table, one row per configuration
- findings.py           what the table says, in sentences: verdict, noise floor, faster, tied or
                        slower than one GPU, scaling, spread, the runs that did not succeed
- breakdown.py          ## Where a step goes: the split of the step (Split, step_split)
- comparison/plots.py   ## Pictures, the table's and the split's figures drawn
- environment.py        ## Environment
and as projection.md shows them (the cost models are comparison/projection.py):
- projection_scaling.py ## Scaling past this machine
- projection_memory.py  ## Memory per GPU: what fits (recommendation.py weighs the same state)"""
