"""A node process imports only what it uses: hivemind's used parts, no TorchDynamo."""

from __future__ import annotations

import subprocess
import sys

SCRIPT = """
import sys, warnings
warnings.simplefilter("error")
import distronet.node.swarm.stack
assert "hivemind.moe" not in sys.modules and "hivemind.averaging" not in sys.modules, "eager"
assert "scipy" not in sys.modules, "scipy"
import hivemind
from hivemind.p2p import PeerID
assert hivemind.p2p.PeerID is PeerID
assert hivemind.DHT.__name__ == "DHT" and "hivemind.averaging" in sys.modules  # the full package now
print("ok", hivemind.__version__)
"""


def test_hivemind_init_is_deferred_until_a_top_level_name_is_used() -> None:
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.startswith("ok 1.")


DYNAMO = """
import sys
import torch
from distronet.node.daemon.parts import no_dynamo_for_optimizers
no_dynamo_for_optimizers()
no_dynamo_for_optimizers()
p = torch.nn.Parameter(torch.ones(3))
opt = torch.optim.SGD([p], lr=0.5)  # (SGD.step itself imports dynamo; DistroOptimizer's does not)
opt.add_param_group({"params": [torch.nn.Parameter(torch.zeros(2))], "lr": 0.1})
p.grad = torch.ones(3)
opt.state[p]["v"] = torch.ones(3)
opt.zero_grad()
state = opt.state_dict()
opt.load_state_dict(state)
assert p.grad is None and len(opt.param_groups) == 2 and torch.equal(opt.state[p]["v"], torch.ones(3))
print("dynamo imported:", "torch._dynamo" in sys.modules)
"""


TORCHLESS = """
import sys, warnings
warnings.simplefilter("error")
import distronet.node.daemon.node, distronet.node.join, distronet.node.models.spec
from distronet.node.cli import build_parser
build_parser()  # every sub-command registered: `distro-node join` starts with this
from distronet.node.models.spec import ModelSpec
ModelSpec.from_run({"arch": "gpt", "depth": 2})
assert "torch" not in sys.modules, "torch"
from hivemind.utils import MSGPackSerializer, get_logger  # the cheap names: still no torch
assert "torch" not in sys.modules, "torch via a cheap name"
from distronet.node.daemon.parts import preload_torch, wait_torch
t = preload_torch()
assert wait_torch(120) and not t.is_alive() and "torch" in sys.modules
import hivemind.utils, hivemind.dht
assert hivemind.utils.MPFuture.__name__ == "MPFuture" and hivemind.dht.DHT.__name__ == "DHT"
from distronet.node.daemon.trainer import ModelSpec as Same
assert Same is ModelSpec
print("ok")
"""


def test_the_daemon_connects_before_torch_is_needed() -> None:
    """Importing the daemon (and checking the run's model) loads no torch: ``join`` loads it
    in a background thread while the node reads the run, joins and starts p2pd; hivemind's
    ``utils`` and ``dht`` packages give their torch-free names without their ``__init__``."""
    out = subprocess.run([sys.executable, "-c", TORCHLESS], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "ok"


def test_optimizers_work_without_importing_dynamo() -> None:
    out = subprocess.run([sys.executable, "-c", DYNAMO], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "dynamo imported: False"


def test_the_decoder_is_warmed_ahead_in_the_background() -> None:
    script = (
        "import sys\nfrom distronet.node.daemon.parts import wait_decoder_warm, warm_decoder\n"
        "t = warm_decoder(); done = wait_decoder_warm(120)\n"
        "from distronet.kernels import coding\n"
        "print(done and not t.is_alive(), coding.use_jit() == coding.HAVE_JIT)"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=150)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["True", "True"]


def test_a_warmed_cache_is_trusted_by_later_processes() -> None:
    """``warm_compiled_decoder`` leaves the marker (node's, not kernels'); a later process that
    finds it decodes compiled at once, before its own warm-up has run."""
    first = (
        "from distronet.kernels import coding\nfrom distronet.node.daemon import parts\n"
        "print(parts.warm_compiled_decoder(), parts._decoder_marker().read_text() == coding.jit_stamp())"
    )
    out = subprocess.run([sys.executable, "-c", first], capture_output=True, text=True, timeout=150)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["True", "True"]
    later = (
        "from distronet.kernels import coding\nfrom distronet.node.daemon import parts\n"
        "before = coding.use_jit(); parts._trust_cached_decoder(); print(before, coding.use_jit())"
    )
    out = subprocess.run([sys.executable, "-c", later], capture_output=True, text=True, timeout=150)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["False", "True"]
