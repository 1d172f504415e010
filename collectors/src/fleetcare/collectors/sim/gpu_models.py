"""Per-model baselines of the simulated GPUs (what NVML reports on a healthy part).

Numbers are those of the SXM parts in DGX/HGX systems: power limit, framebuffer as
NVML reports it, NVLink count, PCIe generation/width, clocks, idle/load temperatures.
Ampere and later replaced page retirement with row remapping, so the simulator never
reports ``retired_pages_*`` for any of these models (they stay null).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class GpuModel:
    key: str
    name: str  # nvmlDeviceGetName
    power_limit_w: float
    idle_power_w: float
    fb_total_mib: int
    nvlinks: int
    pcie_gen: int
    pcie_width: int
    sm_clock_max_mhz: int
    sm_clock_idle_mhz: int
    mem_clock_mhz: int
    idle_rise_c: float  # GPU temperature above ambient when idle
    load_rise_c: float  # additional rise at full power
    slowdown_temp_c: float  # thermal slowdown threshold


MODELS: dict[str, GpuModel] = {
    "H100": GpuModel(
        key="H100", name="NVIDIA H100 80GB HBM3", power_limit_w=700.0, idle_power_w=72.0,
        fb_total_mib=81559, nvlinks=18, pcie_gen=5, pcie_width=16, sm_clock_max_mhz=1980,
        sm_clock_idle_mhz=345, mem_clock_mhz=2619, idle_rise_c=8.0, load_rise_c=38.0,
        slowdown_temp_c=87.0,
    ),
    "H200": GpuModel(
        key="H200", name="NVIDIA H200", power_limit_w=700.0, idle_power_w=76.0,
        fb_total_mib=143771, nvlinks=18, pcie_gen=5, pcie_width=16, sm_clock_max_mhz=1980,
        sm_clock_idle_mhz=345, mem_clock_mhz=3201, idle_rise_c=8.0, load_rise_c=37.0,
        slowdown_temp_c=87.0,
    ),
    "A100": GpuModel(
        key="A100", name="NVIDIA A100-SXM4-80GB", power_limit_w=400.0, idle_power_w=58.0,
        fb_total_mib=81920, nvlinks=12, pcie_gen=4, pcie_width=16, sm_clock_max_mhz=1410,
        sm_clock_idle_mhz=210, mem_clock_mhz=1593, idle_rise_c=7.0, load_rise_c=34.0,
        slowdown_temp_c=85.0,
    ),
}
