/*
 * src/common/optim_int.h - what common/optim.c shares with its tests and
 * with emb_store_set_vec_max() (store/store.h), not installed with the
 * public optim.h.
 */
#ifndef EMB_COMMON_OPTIM_INT_H
#define EMB_COMMON_OPTIM_INT_H

/*
 * The widest vector copy an optimizer update uses: 64 (AVX-512), 32 (AVX2)
 * or 0 (the scalar loops), and never wider than the CPU has. Only tests
 * lower it, to run the narrower copies on a machine with the wider ones.
 */
extern unsigned emb__optim_vec_max;

#endif
