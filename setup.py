"""spec_decode: exact speculative decoding for T5 encoder-decoders in JAX."""

import glob
import os

import setuptools


def _data_files(top: str) -> list[tuple[str, list[str]]]:
  """gin/ and configs/ ship under <prefix>/share/spec_decode/ (the library
  finds them there when it is not run from a source checkout)."""
  by_dir: dict[str, list[str]] = {}
  for path in sorted(glob.glob(f'{top}/**/*.gin', recursive=True)):
    target = os.path.join('share', 'spec_decode', os.path.dirname(path))
    by_dir.setdefault(target, []).append(path)
  return sorted(by_dir.items())


_CORE = [
    'jax==0.10.2',
    'jaxlib==0.10.2',
    'flax==0.12.8',
    'optax==0.2.8',
    'orbax-checkpoint==0.12.8',
    'gin-config==0.5.0',
    'numpy>=1.26',
    'sentencepiece>=0.2',
    'safetensors>=0.4',
    'tqdm>=4.66',
    'matplotlib>=3.8',
]

_EXTRAS = {
    'test': [
        'pytest>=8',
        # make test runs the test files on several processes (-n).
        'pytest-xdist>=3.5',
        'pytest-timeout>=2.3',
        'scipy>=1.11',
        'ruff>=0.6',
        'nbclient>=0.10',
        'nbformat>=5.10',
        'ipykernel>=6',
    ],
    # The CPU wheel of torch 2.13.0 lies on the build machines' disk.
    'hf': ['torch==2.13.0', 'transformers>=5,<6'],
    'metrics': ['sacrebleu>=2.4', 'rouge-score>=0.1.2'],
    # seqio tasks as eval data (spec_decode/data/seqio_data.py); the versions
    # CI installs (about 2.5 GB, TensorFlow included).
    'seqio': [
        'seqio==0.0.20',
        'tensorflow==2.21.0',
        'tensorflow-text==2.21.1',
        'tensorflow-datasets==4.9.10',
    ],
}
_EXTRAS['all'] = sorted({d for deps in _EXTRAS.values() for d in deps})

setuptools.setup(
    name='spec_decode',
    version='0.1.0',
    description=(
        'Speculative decoding (Leviathan et al., 2023) for T5 encoder-decoders'
        ' in JAX/Flax, mirroring T5X.'
    ),
    # The pinned jax, jaxlib, flax and orbax-checkpoint need Python 3.11.
    python_requires='>=3.11',
    packages=setuptools.find_packages(include=['spec_decode', 'spec_decode.*']),
    package_data={'spec_decode.kernels': ['*.cc']},
    data_files=_data_files('gin') + _data_files('configs'),
    install_requires=_CORE,
    extras_require=_EXTRAS,
    entry_points={'console_scripts': ['spec-decode=spec_decode.main:run']},
)
