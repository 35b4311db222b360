"""A requirement on a sub-probe such as ``torch.cuda`` implies its accelerator: the framework
probes say which accelerator each sub-probe is for (``SubProbe.accelerator``)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

import gpulayer as gl
from gpulayer import joboptions
from gpulayer.cli.jobs import SUBMIT_SPELLING
from gpulayer.errors import InvalidRequirement
from gpulayer.profiles import implied_accelerator, resolve_requirements
from gpulayer.specs import Requirements

pytestmark = pytest.mark.usefixtures("gpulayer_isolated")


def double(x: int) -> int:
    return 2 * x


def test_the_bundled_probes_say_which_accelerator_each_sub_probe_is_for() -> None:
    assert implied_accelerator({"torch.cuda": ">=2", "torch": "", "numpy": ""}) == {"torch.cuda": "cuda"}
    assert implied_accelerator({"jax.rocm": "", "mlx.metal": ""}) == {"jax.rocm": "rocm", "mlx.metal": "mps"}
    assert implied_accelerator({"torch": ">=2.2"}) == {}


def test_a_sub_probe_alone_makes_a_job_of_its_accelerator() -> None:
    req = resolve_requirements(Requirements(frameworks={"torch.cuda": ">=2"}))
    # one device, as with --accelerator cuda: no longer a CPU job with CUDA_VISIBLE_DEVICES=''
    assert (req.accelerator, req.device_count) == ("cuda", 1)
    assert resolve_requirements(req) == req
    assert resolve_requirements(Requirements(accelerator="cuda", frameworks={"torch.cuda": ""})).accelerator == "cuda"
    assert resolve_requirements(Requirements(frameworks={"torch": ""})).accelerator is None


def test_the_cli_builds_it_and_lets_gpus_through() -> None:
    spec = joboptions.command_job(["true"], {"frameworks": ["torch.cuda>=2"], "gpus": 2}, SUBMIT_SPELLING)
    assert resolve_requirements(spec.requirements).model_dump(exclude_defaults=True) == {
        "accelerator": "cuda", "gpus": 2, "frameworks": {"torch.cuda": ">=2"}}
    # at decoration the plugins are not read yet: a dotted name may name an accelerator
    fn = gl.remote(gpus=2, frameworks={"torch.cuda": ""})(double)
    assert fn.spec(1).requirements.gpus == 2


BAD: list[tuple[Callable[[], object], str]] = [
    (lambda: joboptions.command_job(["true"], {"frameworks": ["torch.cuda>=2"], "accelerator": "rocm"}, SUBMIT_SPELLING),
     "--framework 'torch.cuda>=2': 'torch.cuda' is for accelerator 'cuda', but the job asks for 'rocm'; accepted: "
     "--accelerator cuda or none (it implies cuda), or 'torch.rocm' for rocm"),
    (lambda: joboptions.command_job(["true"], {"frameworks": ["torch.cuda"], "accelerator": "cpu"}, SUBMIT_SPELLING),
     "--framework torch.cuda: 'torch.cuda' is for accelerator 'cuda', but the job asks for 'cpu'; accepted: "
     "--accelerator cuda or none (it implies cuda)"),
    (lambda: joboptions.command_job(["true"], {"frameworks": ["torch.cuda"], "profile": "pytorch-mps"}, SUBMIT_SPELLING),
     "--framework torch.cuda: 'torch.cuda' is for accelerator 'cuda', but the job asks for 'mps'; accepted: "
     "--accelerator cuda or none (it implies cuda), or 'torch.mps' for mps"),
    (lambda: gl.remote(frameworks={"torch.cuda": "", "jax.rocm": ""})(double).spec(1),
     "@gl.remote(frameworks={'torch.cuda': ''}): the frameworks name sub-probes of different accelerators: "
     "'torch.cuda' (cuda), 'jax.rocm' (rocm); accepted: sub-probes of one accelerator, the one the job runs on"),
    (lambda: gl.remote(accelerator="mps", frameworks={"torch.cuda": ">=2"})(double).spec(1),
     "@gl.remote(frameworks={'torch.cuda': '>=2'}): 'torch.cuda' is for accelerator 'cuda', but the job asks for "
     "'mps'; accepted: accelerator='cuda' or none (it implies cuda), or 'torch.mps' for mps"),
    (lambda: resolve_requirements(Requirements(accelerator="rocm", frameworks={"cupy.cuda": ""})),
     "Requirements(frameworks={'cupy.cuda': ''}): 'cupy.cuda' is for accelerator 'cuda', but the job asks for "
     "'rocm'; accepted: accelerator='cuda' or none (it implies cuda), or 'cupy.rocm' for rocm"),
]


@pytest.mark.parametrize(("make", "message"), BAD, ids=[m[:50] for _, m in BAD])
def test_a_sub_probe_of_another_accelerator_is_refused_naming_the_input(make: Callable[[], object],
                                                                        message: str) -> None:
    with pytest.raises(InvalidRequirement) as info:
        make()
    assert str(info.value) == message


@pytest.mark.parametrize(("req", "said"), [
    (Requirements(gpus=1), "Requirements(gpus=1): devices need an accelerator, and none is named; accepted: gpus "
                           "together with accelerator='KIND' (cuda, mps, rocm), or with a profile= that names one"),
    (Requirements(compute_capability=">=8.0", profile="cpu"),
     "Requirements(compute_capability='>=8.0'): applies only to accelerator devices, and the profile 'cpu' names "
     "none; accepted: compute_capability together with accelerator='KIND' (cuda, mps, rocm), or with a profile= "
     "that names one"),
])
def test_devices_asked_of_a_spec_built_by_hand_need_an_accelerator(req: Requirements, said: str) -> None:
    """gl.submit(DistributedJob(..., requirements=Requirements(gpus=1))) was placed on a CPU
    slot without a word (the front ends refuse it; a spec built by hand went through)."""
    with pytest.raises(InvalidRequirement) as e:
        resolve_requirements(req)
    assert str(e.value) == said
    with pytest.raises(InvalidRequirement) as submitted:
        gl.submit(gl.DistributedJob(entry="train.py", requirements=req))
    assert str(submitted.value) == said
    assert resolve_requirements(Requirements(gpus=0)).accelerator is None
    assert resolve_requirements(Requirements(gpus=2, frameworks={"torch.cuda": ""})).accelerator == "cuda"
