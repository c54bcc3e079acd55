"""Load time and peak host memory of a base-size model in each format.

    spec-decode bench load [--config t5_1_1_base] [--out f.json]

Writes one random model (default T5 v1.1 base: emb 768, 12 heads, mlp 2048,
12+12 layers, 248M parameters) into a temporary directory as our orbax
checkpoint, a Hugging Face directory (safetensors; also `pytorch_model.bin`
when torch is installed) and a T5X checkpoint, then loads each in a fresh
process and reports wall time and the process's peak resident memory
(`ru_maxrss`) above its baseline after imports, next to the size of the
parameters. A loader that held two full float32 copies would show an excess
near 2x the model. Peak RSS counts file pages a loader memory-maps (torch's
`mmap=True`); the anonymous-memory column (sampled `RssAnon`) does not.
"""

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import threading
import time

_FORMATS = ('orbax', 'hf_safetensors', 'hf_torch_bin', 't5x')


def _rss_mib() -> float:
  with open('/proc/self/statm') as f:
    pages = int(f.read().split()[1])
  return pages * os.sysconf('SC_PAGE_SIZE') / 2**20


def _peak_mib() -> float:
  return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _anon_mib() -> float:
  """Anonymous resident memory (no file-backed pages such as mmaps)."""
  with open('/proc/self/status') as f:
    for line in f:
      if line.startswith('RssAnon:'):
        return int(line.split()[1]) / 1024
  return float('nan')


class _AnonPeak:
  """Samples `RssAnon` every 2 ms in a thread; the kernel keeps no peak."""

  def __init__(self):
    self.peak = _anon_mib()
    self._stop = threading.Event()
    self._thread = threading.Thread(target=self._run, daemon=True)
    self._thread.start()

  def _run(self):
    while not self._stop.wait(0.002):
      self.peak = max(self.peak, _anon_mib())

  def stop(self) -> float:
    self._stop.set()
    self._thread.join()
    self.peak = max(self.peak, _anon_mib())
    return self.peak


def _write(config_name: str, root: str) -> dict:
  """Child process: writes the model in every format; returns file sizes."""
  import jax  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top

  import spec_decode as sd  # pylint: disable=g-import-not-at-top
  from spec_decode.checkpoints import huggingface  # pylint: disable=g-import-not-at-top
  from spec_decode.checkpoints import t5x  # pylint: disable=g-import-not-at-top

  model = sd.Model.init(sd.T5Config.from_gin(config_name), seed=0)
  jax.block_until_ready(model.params)
  model.save(os.path.join(root, 'orbax'))
  hf_dir = os.path.join(root, 'hf_safetensors')
  huggingface.save_safetensors(model, hf_dir)
  t5x.save(model, os.path.join(root, 't5x'))
  try:
    import torch  # pylint: disable=g-import-not-at-top
    from safetensors import safe_open  # pylint: disable=g-import-not-at-top
  except ImportError:
    torch = None
  if torch is not None:
    bin_dir = os.path.join(root, 'hf_torch_bin')
    os.makedirs(bin_dir)
    with safe_open(os.path.join(hf_dir, 'model.safetensors'), 'np') as f:
      state = {k: torch.from_numpy(np.array(f.get_tensor(k))) for k in f.keys()}
    torch.save(state, os.path.join(bin_dir, 'pytorch_model.bin'))
    del state
    with open(os.path.join(hf_dir, 'config.json')) as src:
      with open(os.path.join(bin_dir, 'config.json'), 'w') as dst:
        dst.write(src.read())
  n = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(model.params))
  return {
    'parameters': n,
    'config': model.config.to_dict(),
    'disk_mib': {
      f: _du(os.path.join(root, f))
      for f in _FORMATS
      if os.path.exists(os.path.join(root, f))
    },
  }


def _du(path: str) -> float:
  total = 0
  for d, _, files in os.walk(path):
    total += sum(os.path.getsize(os.path.join(d, f)) for f in files)
  return total / 2**20


def _load(fmt: str, path: str, config_json: str, dtype: str) -> dict:
  """Child process: loads one format; returns time and memory."""
  import jax  # pylint: disable=g-import-not-at-top

  import spec_decode as sd  # pylint: disable=g-import-not-at-top

  jax.block_until_ready(jax.numpy.zeros(1))  # Start the runtime first.
  base_rss = _rss_mib()
  base_peak = _peak_mib()
  base_anon = _anon_mib()
  config = sd.T5Config.from_json(config_json) if fmt == 't5x' else None
  sampler = _AnonPeak()
  start = time.perf_counter()
  model = sd.Model.load(path, config=config, dtype=dtype)
  jax.block_until_ready(model.params)
  seconds = time.perf_counter() - start
  anon_peak = sampler.stop()
  return {
    'baseline_anon_mib': base_anon,
    'peak_anon_mib': anon_peak,
    'format': fmt,
    'dtype': dtype,
    'seconds': seconds,
    'baseline_rss_mib': base_rss,
    'baseline_peak_mib': base_peak,
    'peak_rss_mib': _peak_mib(),
    'final_rss_mib': _rss_mib(),
  }


# What a fresh child process runs: `child_main(['write' | 'load', ...])`.
_CHILD_CODE = (
  'import sys; from spec_decode.bench import load; '
  'sys.exit(load.child_main(sys.argv[1:]))'
)


def child_main(args: list[str]) -> int:
  """In the child: `_write` or `_load` per `args[0]`; prints its JSON."""
  kind, *rest = args
  result = _write(*rest) if kind == 'write' else _load(*rest)
  print(json.dumps(result))
  return 0


def run_in_child(args: list[str]) -> dict:
  """`child_main(args)` in a fresh Python process; its JSON result."""
  out = subprocess.run(
    [sys.executable, '-c', _CHILD_CODE, *args],
    check=True,
    capture_output=True,
    text=True,
  )
  return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
  p = argparse.ArgumentParser(
    prog='spec-decode bench load', description=__doc__.splitlines()[0]
  )
  p.add_argument('--config', default='t5_1_1_base', help='gin model file')
  p.add_argument('--dtypes', default='float32,bfloat16')
  p.add_argument('--out', help='write the results as JSON here')
  args = p.parse_args(argv)

  with tempfile.TemporaryDirectory(prefix='load_bench_') as root:
    start = time.perf_counter()
    info = run_in_child(['write', args.config, root])
    print(
      f'wrote {args.config} ({info["parameters"] / 1e6:.1f}M parameters) '
      f'in every format in {time.perf_counter() - start:.0f}s'
    )
    config_json = json.dumps(info['config'])
    results = []
    for dtype in args.dtypes.split(','):
      for fmt in _FORMATS:
        if fmt in info['disk_mib']:
          r = run_in_child(
            ['load', fmt, os.path.join(root, fmt), config_json, dtype]
          )
          results.append(r)
  itemsize = {'float32': 4, 'bfloat16': 2}
  print(
    f'{"format":15} {"dtype":9} {"disk MiB":>8} {"model MiB":>9} '
    f'{"load s":>6} {"peak RSS+":>9} {"/model":>6} {"peak anon+":>10} '
    f'{"/model":>6}'
  )
  for r in results:
    model_mib = info['parameters'] * itemsize.get(r['dtype'], 4) / 2**20
    r['model_mib'] = model_mib
    r['disk_mib'] = info['disk_mib'][r['format']]
    r['peak_above_baseline_mib'] = r['peak_rss_mib'] - r['baseline_rss_mib']
    r['peak_over_model'] = r['peak_above_baseline_mib'] / model_mib
    anon = r['peak_anon_mib'] - r['baseline_anon_mib']
    r['peak_anon_above_baseline_mib'] = anon
    print(
      f'{r["format"]:15} {r["dtype"]:9} {r["disk_mib"]:8.0f} '
      f'{model_mib:9.0f} {r["seconds"]:6.2f} '
      f'{r["peak_above_baseline_mib"]:9.0f} {r["peak_over_model"]:6.2f} '
      f'{anon:10.0f} {anon / model_mib:6.2f}'
    )
  print(
    'peak RSS+: ru_maxrss minus the RSS after imports (includes file pages '
    'a loader maps); peak anon+: sampled anonymous RSS minus its baseline.'
  )
  if args.out:
    with open(args.out, 'w') as f:
      json.dump({'parameters': info['parameters'], 'results': results}, f,
                indent=2)  # fmt: skip
  return 0
