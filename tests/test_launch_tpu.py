"""`launch_tpu.sh`: its --dry-run plan, its argument checks, shellcheck."""

import os
import re
import shlex
import shutil
import subprocess

import pytest

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_SCRIPT = os.path.join(_ROOT, 'launch_tpu.sh')


def _launch(*args: str) -> subprocess.CompletedProcess:
  env = dict(os.environ, PATH='/usr/bin:/bin')  # no gcloud needed
  return subprocess.run(
    ['bash', _SCRIPT, *args],
    capture_output=True,
    text=True,
    env=env,
    timeout=60,
    cwd=_ROOT,
  )


def _commands(stdout: str) -> list[list[str]]:
  """The printed commands (lines starting with '+ '), split into words."""
  return [
    shlex.split(line[2:])
    for line in stdout.splitlines()
    if line.startswith('+ ')
  ]


def _remote(cmd: list[str]) -> list[str]:
  """The words of an ssh command's --command string."""
  return shlex.split(cmd[cmd.index('--command') + 1])


def test_script_header():
  with open(_SCRIPT) as f:
    lines = f.read().splitlines()
  assert lines[0].startswith('#!') and 'bash' in lines[0]
  assert 'set -euo pipefail' in lines
  assert os.access(_SCRIPT, os.X_OK)
  # The examples' config files exist.
  named = re.findall(r'configs/[\w/.-]+\.(?:gin|env)', '\n'.join(lines))
  assert named
  root = os.path.dirname(_SCRIPT)
  assert [p for p in named if not os.path.exists(os.path.join(root, p))] == []


def test_dry_run_plan_from_config_file():
  result = _launch(
    '--config',
    'configs/tpu/v5e-16.env',
    '--gin_file',
    'configs/demo.gin',
    '--gin',
    'GAMMA=7',
    '--gin.TEMPERATURE=0.5',
    '--dry-run',
  )
  assert result.returncode == 0, result.stderr
  cmds = _commands(result.stdout)
  gcloud = [c for c in cmds if c[0] == 'gcloud']
  create, scp, unpack, install, *runs = gcloud
  assert len(runs) == 4  # One command per worker of the 4-host slice.
  assert create[:5] == ['gcloud', 'compute', 'tpus', 'tpu-vm', 'create']
  assert create[5] == 'spec-decode-v5e-16'
  for flag, value in (
    ('--zone', 'us-west4-a'),
    ('--accelerator-type', 'v5litepod-16'),
    ('--version', 'v2-alpha-tpuv5-lite'),
  ):
    assert create[create.index(flag) + 1] == value
  assert scp[:5] == ['gcloud', 'compute', 'tpus', 'tpu-vm', 'scp']
  assert scp[6] == 'spec-decode-v5e-16:spec_decode.tar.gz'
  for cmd in (scp, unpack, install):
    assert '--worker=all' in cmd
  for cmd in (scp, unpack, install, *runs):
    assert cmd[cmd.index('--zone') + 1] == 'us-west4-a'
  for cmd in (unpack, install, *runs):
    assert cmd[:6] == [
      'gcloud',
      'compute',
      'tpus',
      'tpu-vm',
      'ssh',
      'spec-decode-v5e-16',
    ]
  assert 'tar' in _remote(unpack)
  words = _remote(install)
  assert 'pip' in words and '.[all]' in words and 'jax[tpu]==0.10.2' in words
  # The coordinator is worker 0's internal IP, looked up first.
  (lookup,) = [c for c in cmds if c[0].startswith('COORDINATOR_IP=')]
  assert 'describe' in lookup
  for worker, run in enumerate(runs):
    assert f'--worker={worker}' in run
    words = _remote(run)
    i = words.index('spec-decode')
    assert words[i:] == [
      'spec-decode',
      'eval',
      '--gin_file=configs/demo.gin',
      '--gin.GAMMA=7',
      '--gin.TEMPERATURE=0.5',
      '--gin.NUM_PARTITIONS=8',  # The config's mesh.
    ]
    for setting in (
      'JAX_COORDINATOR_ADDRESS=$COORDINATOR_IP:8476',
      'JAX_NUM_PROCESSES=4',
      f'JAX_PROCESS_ID={worker}',
    ):
      assert setting in words
  # The tarball of this checkout is built locally before the copy.
  assert any(c[0] == 'git' and 'ls-files' in c for c in cmds)


def test_flags_override_config_and_git_clone():
  result = _launch(
    '--config',
    'configs/tpu/v4-8.env',
    '--zone',
    'europe-x',
    '--name',
    'mine',
    '--project',
    'proj',
    '--spot',
    '--repo',
    'https://example.com/spec_decode.git',
    '--branch',
    'v1',
    '--extras',
    'hf,metrics',
    '--gin_file=configs/a.gin',
    '--delete-after',
    '--dry-run',
    '--',
    '--gin_search_paths=gin',
  )
  assert result.returncode == 0, result.stderr
  gcloud = [c for c in _commands(result.stdout) if c[0] == 'gcloud']
  create, clone, install, run, delete = gcloud
  assert create[5] == 'mine' and '--spot' in create
  assert create[create.index('--zone') + 1] == 'europe-x'
  assert create[create.index('--project') + 1] == 'proj'
  assert create[create.index('--accelerator-type') + 1] == 'v4-8'
  words = _remote(clone)
  assert words[words.index('clone') :] == [
    'clone',
    '--depth',
    '1',
    '--branch',
    'v1',
    'https://example.com/spec_decode.git',
    'spec_decode',
  ]
  assert '.[hf,metrics]' in _remote(install)
  assert _remote(run)[-4:] == [
    'eval',
    '--gin_file=configs/a.gin',
    '--gin.NUM_PARTITIONS=4',  # v4-8.env's mesh; one host, no coordinator.
    '--gin_search_paths=gin',
  ]
  assert '--worker=0' in run
  assert not any('JAX_COORDINATOR' in w for w in _remote(run))
  assert delete[:5] == ['gcloud', 'compute', 'tpus', 'tpu-vm', 'delete']
  assert not any(c[0] == 'git' for c in _commands(result.stdout))


def test_skip_create_and_install():
  result = _launch(
    '--gin_file', 'x.gin', '--skip-create', '--skip-install', '--dry-run'
  )
  assert result.returncode == 0, result.stderr
  (run,) = _commands(result.stdout)
  assert 'eval' in _remote(run)


@pytest.mark.parametrize(
  'args,message',
  [
    (('--dry-run',), '--gin_file is required'),
    (('--gin_file', 'x.gin', '--bogus', '--dry-run'), 'unknown argument'),
    (('--gin_file', 'x.gin', '--gin', 'NOEQUALS', '--dry-run'), 'NAME=VALUE'),
    (('--config', 'configs/tpu/missing.env', '--dry-run'), 'not found'),
    (('--zone',), 'needs a value'),
  ],
)
def test_bad_arguments(args, message):
  result = _launch(*args)
  assert result.returncode == 2
  assert message in result.stderr
  assert not _commands(result.stdout)


def test_help():
  result = _launch('--help')
  assert result.returncode == 0
  for flag in (
    '--name',
    '--zone',
    '--accelerator-type',
    '--version',
    '--config',
    '--gin_file',
    '--dry-run',
  ):
    assert flag in result.stdout


def test_shellcheck_clean():
  shellcheck = shutil.which('shellcheck')
  if shellcheck is None:
    pytest.skip('shellcheck is not installed')
  result = subprocess.run(
    [shellcheck, _SCRIPT], capture_output=True, text=True, timeout=60
  )
  assert result.returncode == 0, result.stdout + result.stderr
