"""Where a step's time and memory go.

- `profiler`: torch.profiler tables by phase and class of operation (`classes`: the rules;
  `events`: the profile's events read once); `overhead`: the profiler's own cost.
- `memory_timeline`: allocated bytes over a step's phases, and who holds them; `memory_meter`:
  live and peak bytes of each phase, read as a step runs.
"""
