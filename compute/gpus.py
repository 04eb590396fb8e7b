"""Names of the PCI devices Kumo schedules, by vendor and product id: what templates and
users call a GPU model."""

MODELS: dict[tuple[int, int], str] = {
    (0x10DE, 0x20B0): "A100-SXM4-40GB",
    (0x10DE, 0x20B2): "A100-SXM4-80GB",
    (0x10DE, 0x20F1): "A100-PCIE-40GB",
    (0x10DE, 0x20B5): "A100-PCIE-80GB",
    (0x10DE, 0x2330): "H100-SXM5-80GB",
    (0x10DE, 0x2331): "H100-PCIE-80GB",
    (0x15B3, 0x101B): "ConnectX-6",
    (0x15B3, 0x101C): "ConnectX-6-VF",
}


def device_model(vendor_id: int, product_id: int) -> str:
    """The model name, or ``<vendor>:<product>`` in hex for a device not in the table."""
    return MODELS.get((vendor_id, product_id), f"{vendor_id:04x}:{product_id:04x}")
