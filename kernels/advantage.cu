// Hint-augmented GRPO advantages on the GPU: the same two-pass, f64
// semantics as src/normalize/cpu.rs. Compiled to advantage.ptx (compute_90)
// by `cargo run --example gen_ptx --features cuda`; the PTX is committed.

extern "C" __global__ void baseline_sums(const unsigned int *group, const double *reward,
                                         const unsigned char *hinted, int first_turn,
                                         unsigned long long n, double *sum,
                                         unsigned long long *count) {
    for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n;
         i += (unsigned long long)gridDim.x * blockDim.x) {
        if (!first_turn || !hinted[i]) {
            unsigned int g = group[i];
            atomicAdd(&sum[g], reward[i]);
            atomicAdd(&count[g], 1ULL);
        }
    }
}

extern "C" __global__ void group_means(const double *sum, const unsigned long long *count,
                                       unsigned long long n_groups, double *mean) {
    for (unsigned long long g = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;
         g < n_groups; g += (unsigned long long)gridDim.x * blockDim.x) {
        mean[g] = count[g] >= 2 ? sum[g] / (double)count[g] : 0.0;
    }
}

extern "C" __global__ void baseline_squares(const unsigned int *group, const double *reward,
                                            const unsigned char *hinted, int first_turn,
                                            unsigned long long n, const double *mean,
                                            double *squares) {
    for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n;
         i += (unsigned long long)gridDim.x * blockDim.x) {
        if (!first_turn || !hinted[i]) {
            unsigned int g = group[i];
            double d = reward[i] - mean[g];
            atomicAdd(&squares[g], d * d);
        }
    }
}

extern "C" __global__ void group_stds(const double *squares, const unsigned long long *count,
                                      unsigned long long n_groups, int has_floor, double floor_,
                                      double *std_out) {
    for (unsigned long long g = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;
         g < n_groups; g += (unsigned long long)gridDim.x * blockDim.x) {
        double s = 1.0;
        if (count[g] >= 2) {
            s = sqrt(squares[g] / (double)(count[g] - 1));
            if (has_floor && s < floor_) s = floor_;
        }
        std_out[g] = s;
    }
}

extern "C" __global__ void advantages(const unsigned int *group, const double *reward,
                                      unsigned long long n, const double *mean, const double *std_,
                                      int norm_by_std, double epsilon, double *advantage,
                                      double *row_mean, double *row_std) {
    for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n;
         i += (unsigned long long)gridDim.x * blockDim.x) {
        unsigned int g = group[i];
        double m = mean[g], s = std_[g];
        double centred = reward[i] - m;
        advantage[i] = norm_by_std ? centred / (s + epsilon) : centred;
        row_mean[i] = m;
        row_std[i] = s;
    }
}
