// Hint-augmented outcome advantages on the GPU: every estimator of
// src/normalize/mod.rs with the same two-pass, f64 semantics as
// src/normalize/cpu.rs. Compiled to advantage.ptx (compute_70, PTX ISA 8.0,
// so that CUDA 12.0 drivers and newer JIT it for Volta through Hopper) by
// `cargo run --example gen_ptx --features cuda`; the PTX is committed.
//
// Launch order (src/normalize/gpu.rs):
//   per-group estimators: baseline_sums, group_means, baseline_squares,
//   group_stds, advantages;
//   reinforce_pp: step_sums, group_means, step_squares, group_stds,
//   advantages (whole_step = 1), with one "group" at index 0; its sums and
//   squares are over tokens (each row weighs its response length).
// The step_* reductions assume blockDim.x == REDUCE_THREADS.

#define REDUCE_THREADS 256

// Estimator codes; keep in step with `estimator_code` in gpu.rs.
#define EST_GRPO 0
#define EST_DRGRPO 1
#define EST_RLOO 2
#define EST_REINFORCE_PP 3

#define GRID_STRIDE(i, n)                                                                      \
    for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < (n); \
         i += (unsigned long long)gridDim.x * blockDim.x)

// Pass 1, per group: sum and count of each group's baseline rows (raw rows
// only when first_turn).
extern "C" __global__ void baseline_sums(const unsigned int *group, const double *reward,
                                         const unsigned char *hinted, int first_turn,
                                         unsigned long long n, double *sum,
                                         unsigned long long *count) {
    GRID_STRIDE(i, n) {
        if (!first_turn || !hinted[i]) {
            unsigned int g = group[i];
            atomicAdd(&sum[g], reward[i]);
            atomicAdd(&count[g], 1ULL);
        }
    }
}

// Sums `value` over the block into thread 0's return value.
__device__ double block_sum(double value) {
    __shared__ double partial[REDUCE_THREADS];
    partial[threadIdx.x] = value;
    __syncthreads();
    for (unsigned int stride = REDUCE_THREADS / 2; stride > 0; stride >>= 1) {
        if (threadIdx.x < stride) partial[threadIdx.x] += partial[threadIdx.x + stride];
        __syncthreads();
    }
    double total = partial[0];
    __syncthreads();
    return total;
}

// A row's token weight: its response length, 1 at or past n_lengths.
__device__ double token_weight(const unsigned int *length, unsigned long long n_lengths,
                               unsigned long long i) {
    return i < n_lengths ? (double)length[i] : 1.0;
}

// Pass 1, whole step: sum and count of the step's baseline tokens (rows
// weighted by response length) into sum[0] and count[0] (one atomic per
// block).
extern "C" __global__ void step_sums(const double *reward, const unsigned char *hinted,
                                     const unsigned int *length, unsigned long long n_lengths,
                                     int first_turn, unsigned long long n, double *sum,
                                     unsigned long long *count) {
    double s = 0.0, c = 0.0;
    GRID_STRIDE(i, n) {
        if (!first_turn || !hinted[i]) {
            double w = token_weight(length, n_lengths, i);
            s += w * reward[i];
            c += w;
        }
    }
    s = block_sum(s);
    c = block_sum(c);
    if (threadIdx.x == 0) {
        atomicAdd(&sum[0], s);
        atomicAdd(&count[0], (unsigned long long)c);
    }
}

extern "C" __global__ void group_means(const double *sum, const unsigned long long *count,
                                       unsigned long long n_groups, double *mean) {
    GRID_STRIDE(g, n_groups) { mean[g] = count[g] >= 2 ? sum[g] / (double)count[g] : 0.0; }
}

// Pass 2, per group: squared deviations of the baseline rows from their
// group's mean.
extern "C" __global__ void baseline_squares(const unsigned int *group, const double *reward,
                                            const unsigned char *hinted, int first_turn,
                                            unsigned long long n, const double *mean,
                                            double *squares) {
    GRID_STRIDE(i, n) {
        if (!first_turn || !hinted[i]) {
            unsigned int g = group[i];
            double d = reward[i] - mean[g];
            atomicAdd(&squares[g], d * d);
        }
    }
}

// Pass 2, whole step: token-weighted squared deviations from mean[0] into
// squares[0].
extern "C" __global__ void step_squares(const double *reward, const unsigned char *hinted,
                                        const unsigned int *length, unsigned long long n_lengths,
                                        int first_turn, unsigned long long n, const double *mean,
                                        double *squares) {
    double s = 0.0, m = mean[0];
    GRID_STRIDE(i, n) {
        if (!first_turn || !hinted[i]) {
            double d = reward[i] - m;
            s += token_weight(length, n_lengths, i) * d * d;
        }
    }
    s = block_sum(s);
    if (threadIdx.x == 0) atomicAdd(&squares[0], s);
}

extern "C" __global__ void group_stds(const double *squares, const unsigned long long *count,
                                      unsigned long long n_groups, int has_floor, double floor_,
                                      double *std_out) {
    GRID_STRIDE(g, n_groups) {
        double s = 1.0;
        if (count[g] >= 2) {
            s = sqrt(squares[g] / (double)(count[g] - 1));
            if (has_floor && s < floor_) s = floor_;
        }
        std_out[g] = s;
    }
}

// The largest finite double: |x| <= DBL_MAX is false for infinities and NaN.
#define FINITE_MAX 1.7976931348623157e308

__device__ bool finite3(double a, double b, double c) {
    return fabs(a) <= FINITE_MAX && fabs(b) <= FINITE_MAX && fabs(c) <= FINITE_MAX;
}

// Pass 3: every row's advantage, the baseline subtracted (row_mean) and the
// std (row_std). `divide`: A = (s - mean) / (std + epsilon), else s - mean;
// reinforce_pp: A = (s - mean) / sqrt(std * std + epsilon), the reference's
// rsqrt(var + 1e-8) with epsilon = whiten_epsilon; rloo never divides.
// `whole_step`: every row uses index 0 (reinforce_pp). Sets *non_finite to 1
// when any output is not finite (rewards too large for plain sums: the host
// then computes the batch on rescaled rewards, src/normalize/rescaled.rs).
extern "C" __global__ void advantages(const unsigned int *group, const double *reward,
                                      const unsigned char *hinted, int first_turn,
                                      unsigned long long n, const double *sum,
                                      const unsigned long long *count, const double *mean,
                                      const double *std_, int estimator, int divide,
                                      double epsilon, int whole_step, double *advantage,
                                      double *row_mean, double *row_std, int *non_finite) {
    GRID_STRIDE(i, n) {
        unsigned int g = whole_step ? 0 : group[i];
        double r = reward[i], m = mean[g], s = std_[g];
        double a, baseline = m;
        if (estimator == EST_RLOO) {
            unsigned long long c = count[g];
            if (c < 2) {
                baseline = r;
            } else if (!(first_turn && hinted[i])) {
                baseline = (sum[g] - r) / (double)(c - 1);
            }
            a = r - baseline;
        } else if (estimator == EST_REINFORCE_PP) {
            a = (r - m) / sqrt(s * s + epsilon);
        } else {
            double centred = r - m;
            a = divide ? centred / (s + epsilon) : centred;
        }
        advantage[i] = a;
        row_mean[i] = baseline;
        row_std[i] = s;
        if (!finite3(a, baseline, s)) atomicOr(non_finite, 1);
    }
}
