"""Every notebook under notebooks/ runs top to bottom (small settings)."""

import glob
import os

import pytest

nbclient = pytest.importorskip('nbclient')
nbformat = pytest.importorskip('nbformat')

_NOTEBOOKS = os.path.join(
  os.path.dirname(os.path.dirname(os.path.abspath(__file__))), 'notebooks'
)

# Small settings, read by each notebook's parameters cell.
_SMALL = {
  'JAX_PLATFORMS': 'cpu',
  'NB_BATCH': '2',
  'NB_MAX_DECODE_LEN': '12',
  'NB_GAMMA': '3',
  'NB_TIMING_REPEATS': '1',
  'NB_C_VALUES': '0.02,0.1',
  'NB_MAX_GAMMA': '16',
}


def _execute(name: str, monkeypatch, **env) -> nbformat.NotebookNode:
  for key, value in {**_SMALL, **env}.items():
    monkeypatch.setenv(key, value)  # the kernel inherits the environment
  path = os.path.join(_NOTEBOOKS, name)
  nb = nbformat.read(path, as_version=4)
  client = nbclient.NotebookClient(
    nb,
    timeout=900,
    kernel_name='python3',
    resources={'metadata': {'path': _NOTEBOOKS}},
  )
  client.execute()
  return nb


def _text(nb) -> str:
  out = []
  for cell in nb.cells:
    for o in cell.get('outputs', []):
      if o.output_type == 'stream':
        out.append(o.text)
      elif 'data' in o:
        out.append(str(o.data.get('text/html', '')))
        out.append(str(o.data.get('text/plain', '')))
  return '\n'.join(out)


def test_all_notebooks_are_covered():
  found = sorted(
    os.path.basename(p) for p in glob.glob(os.path.join(_NOTEBOOKS, '*.ipynb'))
  )
  assert found == [
    'bring_your_own_checkpoint.ipynb',
    'quickstart.ipynb',
    'theory.ipynb',
  ]


def test_notebooks_are_stored_with_their_outputs():
  """Committed as `make notebooks` ran them (default settings), so GitHub
  shows them: every code cell ran, in order, without an error; the stored
  quickstart holds its Figure 1, the theory notebook its figures."""
  for path in glob.glob(os.path.join(_NOTEBOOKS, '*.ipynb')):
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    code = [c for c in nb.cells if c.cell_type == 'code']
    assert [c.execution_count for c in code] == list(range(1, len(code) + 1)), (
      path
    )
    assert not [
      o for c in code for o in c.outputs if o.output_type == 'error'
    ], path
    assert os.path.getsize(path) < 1_000_000, path
  stored = _text(
    nbformat.read(os.path.join(_NOTEBOOKS, 'quickstart.ipynb'), as_version=4)
  )
  assert 'provenance of sd.generate equals the replay: True' in stored
  assert 'background:#c8f7c5' in stored
  theory = nbformat.read(os.path.join(_NOTEBOOKS, 'theory.ipynb'), 4)
  assert sum('image/png' in o.get('data', {}) for c in theory.cells
             for o in c.get('outputs', [])) >= 3  # fmt: skip


def test_colab_setup_cell_names_no_placeholder():
  """Each notebook's Colab cell takes the repository's URL from a form
  field or $SPEC_DECODE_REPO (else a zip upload); no placeholder URL."""
  cells = []
  for path in sorted(glob.glob(os.path.join(_NOTEBOOKS, '*.ipynb'))):
    nb = nbformat.read(path, as_version=4)
    [setup] = [
      c for c in nb.cells if "'google.colab' in sys.modules" in c.source
    ]
    assert 'OWNER' not in setup.source
    assert "REPO_URL = ''  # @param" in setup.source
    cells.append(setup.source)
  assert len(set(cells)) == 1  # The same cell in every notebook.


def test_quickstart(monkeypatch):
  nb = _execute('quickstart.ipynb', monkeypatch)
  text = _text(nb)
  assert 'rows identical to plain decoding: 2 / 2' in text
  assert 'replay equals sd.generate: True' in text
  assert 'provenance of sd.generate equals the replay: True' in text
  assert 'Theorem 3.8 predicts' in text
  # The Figure 1 picture: accepted / rejected / corrected spans.
  assert 'background:#c8f7c5' in text and 'background:#c5d8f7' in text


def test_theory(monkeypatch):
  nb = _execute('theory.ipynb', monkeypatch)
  images = [
    o
    for c in nb.cells
    for o in c.get('outputs', [])
    if 'data' in o and 'image/png' in o.data
  ]
  assert len(images) >= 3  # Figures 2, 3 and 4


def _tiny_hf_checkpoint(path: str) -> None:
  """A tiny T5 v1.1 in the Hugging Face layout (transformers if present)."""
  try:
    import transformers  # pylint: disable=g-import-not-at-top
  except ImportError:
    transformers = None
  if transformers is not None:
    config = transformers.T5Config(
      vocab_size=64,
      d_model=32,
      d_kv=8,
      d_ff=64,
      num_layers=2,
      num_decoder_layers=2,
      num_heads=4,
      feed_forward_proj='gated-gelu',
      tie_word_embeddings=False,
      dropout_rate=0.0,
      decoder_start_token_id=0,
      pad_token_id=0,
      eos_token_id=1,
    )
    transformers.T5ForConditionalGeneration(config).save_pretrained(path)
    return
  import spec_decode as sd  # pylint: disable=g-import-not-at-top
  from spec_decode.checkpoints import huggingface  # pylint: disable=g-import-not-at-top

  cfg = sd.T5Config(
    vocab_size=64,
    emb_dim=32,
    num_heads=4,
    head_dim=8,
    mlp_dim=64,
    num_encoder_layers=2,
    num_decoder_layers=2,
    mlp_activations=('gelu', 'linear'),
    dropout_rate=0.0,
  )
  huggingface.save_safetensors(sd.Model.init(cfg), path)


def test_bring_your_own_checkpoint(monkeypatch, tmp_path):
  checkpoint = str(tmp_path / 'tiny_hf_t5')
  _tiny_hf_checkpoint(checkpoint)
  nb = _execute(
    'bring_your_own_checkpoint.ipynb', monkeypatch, BYOC_CHECKPOINT=checkpoint
  )
  text = _text(nb)
  assert 'identical to plain decoding: 2 / 2 rows' in text
  assert checkpoint in text


def test_bring_your_own_checkpoint_with_a_t5x_gin_file(monkeypatch):
  """The default stand-in: a T5X checkpoint and a T5X-format model file."""
  monkeypatch.delenv('BYOC_CHECKPOINT', raising=False)
  nb = _execute('bring_your_own_checkpoint.ipynb', monkeypatch)
  text = _text(nb)
  assert 'tiny random T5X stand-in' in text
  assert 'hyperparameters from' in text and 'emb_dim=32' in text
  assert 'identical to plain decoding: 2 / 2 rows' in text
