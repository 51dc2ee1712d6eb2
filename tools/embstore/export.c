/*
 * tools/embstore/export.c - `embstore export`: a dump's rows as text,
 * id<TAB>v0 v1 ..., the weights decoded to fp32 whatever the table's row
 * format, every float printed so that it reads back bit-exact.
 * The whole dump is verified first, so a damaged dump exports nothing.
 */
#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli.h"

static void usage(FILE *f)
{
	fputs("usage: embstore export --in DIR|FILE [options]\n"
	      "Writes a dump's rows as id<TAB>v0 v1 ... (weights only).\n"
	      "  --in DIR|FILE           the dump (or give it as the "
	      "argument)\n"
	      "  --format tsv            the only format\n"
	      "  --out FILE              write there (default "
	      "stdout)\n" EMB_CLI_HELP_BASE,
	      f);
}

/*
 * The stream rows go to: a regular file is written as a temporary next to
 * path (its name in tmp) and renamed over path once complete, so a failed
 * export leaves nothing half-written; anything else (a pipe, /dev/null)
 * is written in place and tmp stays "". NULL with errno on failure.
 */
static FILE *open_out(const char *path, char *tmp, size_t cap)
{
	struct stat st;
	FILE *f;
	int fd;

	tmp[0] = '\0';
	if (stat(path, &st) == 0 && !S_ISREG(st.st_mode))
		return fopen(path, "w");
	if (snprintf(tmp, cap, "%s.tmp-XXXXXX", path) >= (int)cap) {
		tmp[0] = '\0';
		errno = ENAMETOOLONG;
		return NULL;
	}
	fd = mkstemp(tmp);
	if (fd < 0) {
		tmp[0] = '\0';
		return NULL;
	}
	fchmod(fd, 0644);
	f = fdopen(fd, "w");
	if (!f) {
		close(fd);
		unlink(tmp);
		tmp[0] = '\0';
	}
	return f;
}

static int run(struct cli *cli)
{
	struct emb_cli_fileset fs;
	struct emb_snap_meta *metas;
	char p[EMB_SNAP_PATH_MAX + 300];
	char tmp[PATH_MAX] = "";
	FILE *out = stdout;
	int rc = 0;

	if (!cli->dir)
		return emb_cli_usage_error(cli, usage, "export needs --in");
	if (cli->format && strcmp(cli->format, "tsv") != 0)
		return emb_cli_usage_error(cli, usage,
					   "export knows --format tsv only");
	if (emb_cli_fileset_open("export", cli->dir, &fs))
		return 1;
	metas = calloc(fs.n ? fs.n : 1, sizeof(*metas));
	/* Verify first, so a damaged dump exports nothing. */
	if (!metas || emb_cli_fileset_verify("export", &fs, metas)) {
		free(metas);
		emb_cli_fileset_close(&fs);
		return 1;
	}
	if (cli->out) {
		out = open_out(cli->out, tmp, sizeof(tmp));
		if (!out) {
			fprintf(stderr, "embstore export: %s: %s\n", cli->out,
				strerror(errno));
			free(metas);
			emb_cli_fileset_close(&fs);
			return 1;
		}
	}
	for (uint32_t i = 0; i < fs.n && !rc; i++) {
		struct emb_snap_reader *r;
		struct emb_snap_block b;
		float w[EMB_DIM_MAX];

		emb_cli_fileset_path(&fs, i, p, sizeof(p));
		rc = emb_snap_reader_open(p, 0, &r);
		if (rc)
			break;
		while ((rc = emb_snap_reader_next(r, &b)) > 0) {
			for (uint32_t k = 0; k < b.n; k++) {
				/* fp32 whatever the table's row format:
				 * what a pull of the row returns. */
				emb_rowfmt_decode(
				    metas[i].row_format,
				    b.rows + (size_t)k * metas[i].row_floats,
				    w, metas[i].dim);
				fprintf(out, "%llu\t",
					(unsigned long long)b.ids[k]);
				/* %.9g prints a float that reads back
				 * bit-exact. */
				for (uint32_t d = 0; d < metas[i].dim; d++)
					fprintf(out, d ? " %.9g" : "%.9g",
						(double)w[d]);
				fputc('\n', out);
			}
		}
		emb_snap_reader_close(r);
	}
	if (rc)
		fprintf(stderr, "embstore export: %s: %s\n", p,
			emb_cli_snap_err(rc));
	/* A full disk shows up here at the latest: a write error sticks to
	 * the stream, and fsync() and fclose() report what was buffered. */
	if (!rc && (fflush(out) != 0 || ferror(out) ||
		    (out != stdout && tmp[0] && fsync(fileno(out)) != 0))) {
		fprintf(stderr, "embstore export: %s: %s\n",
			cli->out ? cli->out : "stdout",
			strerror(errno ? errno : EIO));
		rc = -EIO;
	}
	if (out != stdout && fclose(out) != 0 && !rc) {
		fprintf(stderr, "embstore export: %s: %s\n", cli->out,
			strerror(errno));
		rc = -EIO;
	}
	/* Whole or not at all: the rows go under the name only now. */
	if (tmp[0] && !rc && rename(tmp, cli->out) != 0) {
		fprintf(stderr, "embstore export: %s: %s\n", cli->out,
			strerror(errno));
		rc = -EIO;
	}
	if (tmp[0] && rc)
		unlink(tmp);
	free(metas);
	emb_cli_fileset_close(&fs);
	return rc ? 1 : 0;
}

int emb_cmd_export(int argc, char **argv)
{
	static const struct option longopts[] = {
	    {"in", required_argument, NULL, 'i'},
	    {"out", required_argument, NULL, 'o'},
	    {"format", required_argument, NULL, 'f'},
	    EMB_CLI_OPTS_BASE,
	    {NULL, 0, NULL, 0},
	};
	struct cli cli;
	int c, status;

	emb_cli_init(&cli, "export");
	optind = 1;
	while ((c = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
		switch (c) {
		case 'i':
			cli.dir = optarg;
			break;
		case 'o':
			cli.out = optarg;
			break;
		case 'f':
			cli.format = optarg;
			break;
		default:
			status = emb_cli_opt(&cli, c, optarg, usage);
			if (status >= 0)
				return status;
		}
	}
	status = emb_cli_finish_dir(&cli, argc, argv, usage);
	return status ? status : run(&cli);
}
