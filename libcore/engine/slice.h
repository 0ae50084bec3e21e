/*
 * slice.h -- slices of a weight matrix [rows][cols] of any weight type: a range of rows, a
 * range of columns, and where a quantized matrix may be cut between columns.
 *
 * Contract
 *   Rows are contiguous for every type (a quantized row is whole blocks), so a row slice is a
 *   pointer into the matrix. A column slice is a copy, built row by row; for a quantized type it
 *   is legal only on block boundaries (the end may be the padded last block), and then it is
 *   whole blocks copied as they are, never requantized. One copy of these rules for the two
 *   places that cut matrices: placing a model over devices (place.c) and writing a model split
 *   into one file per device (split.c).
 */
#ifndef IFLOW_SLICE_H
#define IFLOW_SLICE_H

#include <stdint.h>

/* Rows r0.. of a matrix of `cols` columns of type: a pointer into data. */
const void *iflow_slice_rows(const void *data, int type, int64_t r0, int64_t cols);

/* 0 if columns [c0, c1) of a K-column matrix of type can be cut out (always for float types;
 * on block boundaries for quantized ones), else IFLOW_EUNSUPPORTED naming `name` (a tensor). */
int iflow_slice_columns_check(int type, int64_t c0, int64_t c1, int64_t K, const char *name);

/* Columns [c0, c1) of every one of `rows` rows of a K-column matrix (checked as above), as a
 * new malloc'd matrix [rows][c1-c0]; NULL when out of memory. */
void *iflow_slice_columns(const void *data, int type, int64_t rows, int64_t K, int64_t c0, int64_t c1);

#endif
