// latentq/analysis/lapack.h — the probes' one symmetric eigensolver seam.
//
// Every eigendecomposition of the probes and the study (the SVD basis of fit_svd_basis — the SVD probe,
// the KLT rotation, the shared-basis probe — and the rate–distortion spectrum of latent_spectrum) goes
// through symmetric_eigen() below, which calls LAPACK DSYEVD (divide and conquer; LAPACK Users' Guide
// §2.4.4, "dsyevd") from the same OpenBLAS as the GEMM seam (latentq/analysis/gemm.h: Debian's
// libopenblas-pthread-dev, which ships LAPACK; one thread per call; serialized like the GEMMs when the
// loaded build is not the pthread one). Eigen's own SelfAdjointEigenSolver (Householder tridiagonalization
// and implicit QR) took 0.13 s at n = 512 and 1.0 s at n = 1024 against DSYEVD's 0.047 s and 0.185 s on
// the 2-core CI machine (one thread each), with eigenvalues equal to 2e-13 relative.
//
// Determinism: for the same matrix and the same BLAS kernel the result is bit-for-bit repeatable. Across
// CPUs (another OpenBLAS kernel) the last bits may differ, and within a cluster of (near-)equal
// eigenvalues the eigenvectors are any orthonormal basis of that cluster's subspace.
#pragma once

#include <Eigen/Dense>

namespace latentq::probes {

/// The eigendecomposition A = V·diag(λ)·Vᵀ of a symmetric matrix.
struct SymmetricEigen {
  Eigen::VectorXd values;   ///< [n] λ, ascending (LAPACK's order)
  Eigen::MatrixXd vectors;  ///< [n, n] column j = the unit eigenvector of values[j]; [0, 0] when not computed
};

/// Eigenvalues (and, with `vectors`, eigenvectors) of the symmetric A [n, n] (float64, column-major;
/// only its lower triangle is read). n = 0 gives empty results.
/// Errors: std::invalid_argument if A is not square, n exceeds the LAPACK integer (2^31 − 1), or A's lower
/// triangle has a NaN/Inf (LAPACK's result would be undefined); std::runtime_error if DSYEVD does not
/// converge (INFO > 0), naming n.
SymmetricEigen symmetric_eigen(const Eigen::MatrixXd& A, bool vectors);

}  // namespace latentq::probes
