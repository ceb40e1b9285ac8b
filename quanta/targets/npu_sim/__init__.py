"""npu-sim: a simulated integer-only accelerator (its kernels, rules and profiles).

- :mod:`quanta.targets.npu_sim.kernels` — the one entry point that executes an
  integer-only node (``execute``) and says whether the device can (``supported``);
- :mod:`quanta.targets.npu_sim.rules` — the device's capabilities as data, the
  verifier of the integer-only stage and the constraint profiles of real NPU families
  (Arm Ethos-U).

The lowering pipeline, the partition into device and host nodes and a node-by-node
runner live one layer up, in :mod:`quanta.runtime.npu_sim` (targets import only kernels
and the IR).
"""
