// The Philox seeds of the attention dropout drawn inside cuDNN's fused attention, the CUDA side
// of weft-tensor's `attention_dropout_cuda.rs`. Each fused forward reads its seed from device
// memory: `mix64(site ^ mix64(step))`, where `site` (a kernel argument, fixed in a captured CUDA
// graph) names the block, the dropout site and the micro-batch, and `step` is the
// per-device step value (`dropout.cu`'s `dropout_step`) that the trainer writes before each
// step or replay (so a replayed graph draws new masks). The offset is always 0: distinct seeds
// are distinct Philox keys. SplitMix64's finaliser, as `ops::dropout`'s `mix64`.

__device__ __forceinline__ unsigned long long mix64(unsigned long long z) {
    z += 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

// philox[0] = the seed, philox[2] = the offset (16 bytes apart, as cuDNN's tensors align).
extern "C" __global__ void attention_dropout_philox(const unsigned long long* step,
                                                    unsigned long long site, long long* philox) {
    philox[0] = (long long)(mix64(site ^ mix64(step[0])) >> 1);
    philox[1] = 0;
    philox[2] = 0;
    philox[3] = 0;
}
