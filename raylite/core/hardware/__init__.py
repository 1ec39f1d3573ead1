"""What this machine offers: CPU and memory limits (machine), accelerator families and their
visible-device variables (accelerators), and the probes that count devices (probes).
May import: wire."""
