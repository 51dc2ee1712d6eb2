/*
 * src/plugin/tde_io.h - the IO plugin interface of TorchRec's dynamic
 * embedding (torchrec/csrc/dynamic_embedding, "TDE"), as a C ABI.
 *
 * TDE keeps a bounded set of rows on the GPU and moves the rest to and from
 * a parameter server through a plugin: a shared library it dlopen()s and
 * from which it takes five symbols,
 *
 *	const char *IO_type;				the scheme: "embstore"
 *	void *IO_Initialize(const char *cfg);		cfg: after "embstore://"
 *	void IO_Finalize(void *instance);
 *	void IO_Pull(void *instance, struct tde_io_pull_param p);
 *	void IO_Push(void *instance, struct tde_io_push_param p);
 *
 * Both structs are passed by value, laid out as TDE's IOPullParameter and
 * IOPushParameter (C++ aggregates of exactly these fields, in this order:
 * the same layout). A value TDE stores is addressed by (table name, global
 * id, column id, optimizer state index) and is a blob of bytes: the column
 * is a slice of the embedding (TDE splits wide rows into columns), the
 * state index 0 its weights and 1.. the optimizer's state tensors.
 *
 * TDE may call IO_Pull and IO_Push from several threads at once on one
 * instance; each call reports through its callbacks before it returns (the
 * callbacks may be called from any thread; here, the caller's).
 */
#ifndef EMB_PLUGIN_TDE_IO_H
#define EMB_PLUGIN_TDE_IO_H

#include <stdint.h>

struct tde_io_pull_param {
	const char *table_name;	  /* TDE's table: the embstore tables' stem */
	uint32_t num_cols;	  /* entries of col_ids */
	uint32_t num_global_ids;  /* entries of global_ids */
	const int64_t *col_ids;	  /* the columns wanted of every id */
	const int64_t *global_ids; /* the ids wanted */
	uint32_t num_optimizer_states; /* states 0..n-1 wanted of each */
	void *ctx;		  /* passed back to both callbacks */
	/*
	 * Once per (id i, column j, state s): offset = i * num_cols + j; data
	 * and len the stored bytes, or NULL and 0 when nothing is stored. The
	 * bytes are TDE's to copy during the call only.
	 */
	void (*on_fetched)(void *ctx, uint32_t offset, uint32_t state,
			   void *data, uint32_t len);
	void (*on_all_fetched)(void *ctx); /* last, once */
};

struct tde_io_push_param {
	const char *table_name;
	uint32_t num_cols;
	uint32_t num_global_ids;
	const int64_t *col_ids;
	const int64_t *global_ids;
	uint32_t num_optimizer_states; /* entries of state_ids */
	const uint32_t *state_ids;     /* which states the blobs are */
	/*
	 * Blob k = (id i, column j, state index s) with k = i * num_cols *
	 * num_optimizer_states + j * num_optimizer_states + s is bytes
	 * [offsets[k], offsets[k + 1]) of data; num_offsets = blobs + 1.
	 */
	uint32_t num_offsets;
	const uint64_t *offsets;
	const void *data;
	void *ctx;
	void (*on_push_complete)(void *ctx); /* once, when stored */
};

/* What TDE's registry looks up with dlsym(); everything else is hidden. */
#define TDE_EXPORT __attribute__((visibility("default")))

TDE_EXPORT extern const char *IO_type;
TDE_EXPORT void *IO_Initialize(const char *cfg);
TDE_EXPORT void IO_Finalize(void *instance);
TDE_EXPORT void IO_Pull(void *instance, struct tde_io_pull_param p);
TDE_EXPORT void IO_Push(void *instance, struct tde_io_push_param p);

#endif
