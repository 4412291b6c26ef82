// SPDX-License-Identifier: MIT
// The carrier of the precompiled headers (cmake/LavaflowHelpers.cmake): a translation unit with
// nothing of its own.
