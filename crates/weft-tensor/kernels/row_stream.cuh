// Rows of a channels-last pass streamed into each thread through shared memory by
// asynchronous copies (`cp.async`, sm_80 and later): a thread copies its own next rows' vectors
// into its own slots, STAGES rows ahead, and reads each back once it has arrived. The bytes in
// flight then take shared memory instead of registers. Loaded into registers, bf16's input
// gradient kept 48 KB of loads in flight per SM (four rows of 8-byte vectors a thread, three
// blocks by its 72 registers) and moved 2.28 TB/s on an H100, where f32's, with twice the bytes
// per load, moved 2.81; streamed (56 registers, four blocks, 128 KB in flight) it moves 2.49
// (Nsight Compute, ResNet-50 at batch 128). Eight bf16 channels a thread (16-byte vectors) took
// more registers, fewer blocks, and were slower.
#pragma once
#include "vector.cuh"

// The most threads a block of a streamed pass has (the slots are laid out for them).
constexpr int STREAM_THREADS = 256;

// Rows in flight per thread: 64 bytes of each input (8 rows of 8-byte vectors, 4 of 16).
template <typename V>
struct StreamStages {
    static constexpr int n = 64 / (int)sizeof(V);
};

// Starts copying one vector from global to shared memory.
template <typename V>
__device__ __forceinline__ void copy_async(V* to, const V* from) {
#if __CUDA_ARCH__ >= 800
    const unsigned at = (unsigned)__cvta_generic_to_shared(to);
    if constexpr (sizeof(V) == 16) {
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(at), "l"(from)
                     : "memory");
    } else {
        asm volatile("cp.async.ca.shared.global [%0], [%1], %2;\n" ::"r"(at), "l"(from),
                     "n"((int)sizeof(V))
                     : "memory");
    }
#else
    *to = *from;
#endif
}

// Closes the group of copies started since the last group.
__device__ __forceinline__ void copies_committed() {
#if __CUDA_ARCH__ >= 800
    asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}

// Waits until at most PENDING groups of this thread's copies are still in flight.
template <int PENDING>
__device__ __forceinline__ void copies_arrived() {
#if __CUDA_ARCH__ >= 800
    asm volatile("cp.async.wait_group %0;\n" ::"n"(PENDING) : "memory");
#endif
}

// One row's vectors of K inputs.
template <typename T, int N, int K>
struct RowVecs {
    Vec<T, N> v[K];
};

// Calls use(row) for rows r = first, first + step, ... below rows (fewer than 2^32), in that
// order, where row.v[k] is the vector of N elements at element offset r * c + col of in[k]
// (aligned to the vector). Each thread's slot of a stage is its own: no barrier is needed, and a
// slot is refilled only after the thread has used the row it held. The loop is unrolled by the
// stages, so that every slot's address is fixed, the sources advance by a pointer increment and
// the rows are counted in 32 bits: the streamed passes were bound by instruction issue.
template <typename T, int N, int K, typename Use>
__device__ __forceinline__ void stream_rows(long long first, long long rows, long long step,
                                            const T* const (&in)[K], int c, int col, Use use) {
    using V = Vec<T, N>;
    static_assert(sizeof(V) == 8 || sizeof(V) == 16, "streamed vectors are 8 or 16 bytes");
    constexpr int STAGES = StreamStages<V>::n;
    __shared__ V slots[STAGES][K][STREAM_THREADS];
    const int t = threadIdx.y * blockDim.x + threadIdx.x;
    const V* from[K];
#pragma unroll
    for (int k = 0; k < K; ++k) from[k] = (const V*)(in[k] + first * c + col);
    const long long stride = step * c / N;  // vectors between a thread's rows
    const unsigned count = first < rows ? (unsigned)(rows - 1 - first) / (unsigned)step + 1 : 0;
    unsigned issued = 0;
    auto issue = [&](int stage) {
        if (issued < count) {
#pragma unroll
            for (int k = 0; k < K; ++k) {
                copy_async(&slots[stage][k][t], from[k]);
                from[k] += stride;
            }
            ++issued;
        }
        copies_committed();
    };
#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) issue(s);
    for (unsigned used = 0; used < count;) {
#pragma unroll
        for (int s = 0; s < STAGES; ++s) {
            if (used == count) break;
            issue((s + STAGES - 1) % STAGES);
            copies_arrived<STAGES - 1>();
            RowVecs<T, N, K> row;
#pragma unroll
            for (int k = 0; k < K; ++k) row.v[k] = slots[s][k][t];
            use(row);
            ++used;
        }
    }
}
