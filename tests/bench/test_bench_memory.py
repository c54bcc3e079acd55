"""`spec-decode bench memory`'s T5Gemma part: a decode state's sliding
layers hold the same bytes whatever the output length, its global layers
bytes in proportion to it (read from the arrays; no timing)."""

import json

from spec_decode.bench import memory


def _parts(row):
  for x in row['lengths']:
    # The parts are every array of the state, each counted once.
    assert x['total'] == x['sliding'] + x['global'] + x['cross'] + x['index']
  return tuple(
    [x[part] for x in row['lengths']] for part in ('sliding', 'global', 'cross')
  )


def test_sliding_bytes_are_flat_and_global_bytes_grow(tmp_path, capsys):
  out = tmp_path / 'mem.json'
  code = memory.main([
    '--only', 't5gemma', '--window', '8', '--ring_margin', '4',
    '--out', str(out),
  ])  # fmt: skip
  assert code == 0
  rows = json.loads(out.read_text())['t5gemma']
  assert [r['version'] for r in rows] == [1, 2]
  for r in rows:
    assert [x['length'] for x in r['lengths']] == [64, 256, 1024, 4096]
    assert r['sliding_layers'] and r['global_layers']
    sliding, glob, cross = _parts(r)
    assert len(set(sliding)) == 1, sliding
    assert len(set(cross)) == 1, cross
    # Global layers keep every slot: bytes in proportion to the length
    # (their keys, values and slot table are all per slot).
    assert glob[1:] == [4 * glob[0], 16 * glob[0], 64 * glob[0]], glob
    # The ring's W + G - 1 = 11 entries per sliding layer: float32 keys
    # and values of 2 heads of 16 each, and one int32 slot table.
    assert r['ring_entries'] == 11
    assert sliding[0] == 11 * (r['sliding_layers'] * 2 * 2 * 16 * 4 + 4)
  text = capsys.readouterr().out
  assert 'T5Gemma 2: 10 sliding and 2 global decoder layers' in text
  assert '| sliding layers | global layers |' in text


def test_negative_control_a_window_past_the_lengths_grows():
  # Window 256 >= every length: the ring is the whole output, as a global
  # layer's, so the sliding bytes grow too.
  rows = memory.t5gemma_run(
    window=256, ring_margin=4, lengths=(16, 64, 256), layers=6
  )
  for r in rows:
    sliding, glob, _ = _parts(r)
    assert sliding[1:] == [4 * sliding[0], 16 * sliding[0]], sliding
    assert glob[1:] == [4 * glob[0], 16 * glob[0]], glob
