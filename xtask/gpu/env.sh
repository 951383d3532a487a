# Sourced on the GPU machine from a bundle written by `cargo xtask gpu-bundle` (it is copied
# there as env.sh). Points the dynamic loader at the CUDA 13 / cuDNN / NCCL libraries of the
# machine's PyTorch environment (pip's nvidia-* wheels), keeps NVLink multicast off, and unpacks
# the bundle's .xz binaries next to themselves (with Python's lzma: xz may be absent there).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
site_packages=$(python3 -c 'import site; print(site.getsitepackages()[0])')
export LD_LIBRARY_PATH=$(ls -d "$site_packages"/nvidia/*/lib 2>/dev/null | paste -sd:)${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
for packed in "$(dirname "${BASH_SOURCE[0]}")"/*.xz; do
  [ -f "$packed" ] || continue
  python3 -c "import lzma,sys; open(sys.argv[2],'wb').write(lzma.open(sys.argv[1]).read())" "$packed" "${packed%.xz}" \
    && chmod +x "${packed%.xz}"
done
