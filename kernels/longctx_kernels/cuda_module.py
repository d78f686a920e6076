"""Hand-written CUDA kernels: compiled at first use by NVRTC, launched on PyTorch's stream.

NVRTC and the driver API come from ``cuda.bindings`` (cuda-python), which the CUDA 13
PyTorch wheels already pull in; no CUDA toolkit is needed. The sources use no headers.
"""

from __future__ import annotations

import ctypes
import functools
from dataclasses import dataclass
from pathlib import Path

import torch
from cuda.bindings import driver, nvrtc

CSRC = Path(__file__).with_name("csrc")


class CudaError(RuntimeError):
    pass


def _check(result):
    err, *rest = result if isinstance(result, tuple) else (result,)
    if int(err) != 0:
        raise CudaError(f"{err!r}")
    return rest[0] if len(rest) == 1 else rest


def compile_cubin(source: str, arch: str, defines: tuple[tuple[str, int], ...] = ()) -> bytes:
    """NVRTC: CUDA C++ source -> cubin for `arch` (e.g. "sm_90"), with -D`defines`; the source
    may include any csrc/*.cuh by name. Needs no GPU."""
    headers = sorted(CSRC.glob("*.cuh"))
    prog = _check(nvrtc.nvrtcCreateProgram(source.encode(), b"kernel.cu", len(headers),
                                           [h.read_bytes() for h in headers],
                                           [h.name.encode() for h in headers]))
    # -default-device: unannotated functions (generic lambdas among them) are device code.
    opts = [f"-arch={arch}".encode(), b"-std=c++17", b"-lineinfo", b"-default-device"] + [f"-D{k}={v}".encode() for k, v in defines]
    (err,) = nvrtc.nvrtcCompileProgram(prog, len(opts), opts)
    if int(err) != 0:
        size = _check(nvrtc.nvrtcGetProgramLogSize(prog))
        log = b" " * size
        nvrtc.nvrtcGetProgramLog(prog, log)
        raise CudaError(f"NVRTC failed for {arch}:\n{log.decode(errors='replace')}")
    size = _check(nvrtc.nvrtcGetCUBINSize(prog))
    cubin = b" " * size
    _check(nvrtc.nvrtcGetCUBIN(prog, cubin))
    nvrtc.nvrtcDestroyProgram(prog)
    return cubin


@dataclass(frozen=True)
class Kernel:
    function: object
    shared_bytes: int

    def launch(self, grid: tuple[int, int, int], block: int, args: list[tuple[int | float, type]], stream: int,
               programmatic: bool = False) -> None:
        """`programmatic`: a programmatic dependent launch. The kernel's CTAs may be placed once the
        previous kernel on the stream allows it (griddepcontrol.launch_dependents) and must wait
        (griddepcontrol.wait) for that kernel's end and memory before touching global memory; the
        launch then overlaps the previous kernel's end."""
        values, types = zip(*args)
        if not programmatic:
            _check(driver.cuLaunchKernel(self.function, *grid, block, 1, 1, self.shared_bytes,
                                         driver.CUstream(stream), (values, types), 0))
            return
        config = self._config(grid, block)
        config.hStream = driver.CUstream(stream)
        attr = driver.CUlaunchAttribute()
        attr.id = driver.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
        attr.value.programmaticStreamSerializationAllowed = 1
        config.attrs = [attr]
        config.numAttrs = 1
        _check(driver.cuLaunchKernelEx(config, self.function, (values, types), 0))

    @functools.cache
    def clusters_at_once(self, cluster_size: int, block: int) -> int:
        """How many of the kernel's thread-block clusters (`cluster_size` CTAs of `block` threads, its
        shared memory) the GPU holds at once: a cluster stays within one GPC, so this can be well
        under SMs / cluster_size."""
        return _check(driver.cuOccupancyMaxActiveClusters(self.function, self._config((cluster_size, 1, 1), block)))

    def _config(self, grid: tuple[int, int, int], block: int):
        """A launch configuration of `grid` CTAs of `block` threads and the kernel's shared memory."""
        config = driver.CUlaunchConfig()
        config.gridDimX, config.gridDimY, config.gridDimZ = grid
        config.blockDimX, config.blockDimY, config.blockDimZ = block, 1, 1
        config.sharedMemBytes = self.shared_bytes
        config.numAttrs = 0
        return config


@functools.cache
def load(source_file: str, name: str, device_index: int, defines: tuple[tuple[str, int], ...] = (),
         arch_suffix: str = "") -> Kernel:
    """Compile `csrc/source_file` (with -D`defines`) for the device's architecture and load kernel
    `name`; `<name>_shared_bytes` (a __device__ int in the source) sizes its dynamic shared memory.
    `arch_suffix` "a" targets the architecture-specific variant (sm_90a: wgmma, setmaxnreg)."""
    torch.cuda.init()  # the primary context, current on this thread
    major, minor = torch.cuda.get_device_capability(device_index)
    cubin = compile_cubin((CSRC / source_file).read_text(), f"sm_{major}{minor}{arch_suffix}", defines)
    with torch.cuda.device(device_index):
        module = _check(driver.cuModuleLoadData(cubin))
        function = _check(driver.cuModuleGetFunction(module, name.encode()))
        ptr, size = _check(driver.cuModuleGetGlobal(module, f"{name}_shared_bytes".encode()))
        shared = ctypes.c_int()
        _check(driver.cuMemcpyDtoH(ctypes.addressof(shared), ptr, size))
        limit = torch.cuda.get_device_properties(device_index).shared_memory_per_block_optin
        if shared.value > limit:
            raise CudaError(f"{name} with {dict(defines)} needs {shared.value} B of shared memory a CTA; "
                            f"this GPU allows {limit} B: choose fewer stages or a smaller tile")
        _check(driver.cuFuncSetAttribute(
            function, driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, shared.value))
    return Kernel(function, shared.value)
