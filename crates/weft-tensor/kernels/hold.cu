// hold_stream: one thread that keeps its stream busy for `ns` nanoseconds of the GPU's global
// timer, so that the host can queue a timed sequence of launches behind it; the events around
// that sequence then time the device's work, not the host's pace of launching
// (`ops/device_timing.rs`).

extern "C" __global__ void hold_stream(unsigned long long ns) {
    unsigned long long start, now;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
    do {
        __nanosleep(1000);
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
    } while (now - start < ns);
}
