/* A UCP client and server that connect by IP address (UCX's connection
 * manager: rdma_cm underneath), for roxe's middleware tests. The client
 * sends COUNT tagged messages of SIZE bytes and one stream message; the
 * server checks every byte and answers each tagged message with its
 * checksum, which the client checks. Prints "ucp sockaddr ok" and exits 0
 * when all matched.
 *
 *   ucp_sockaddr server ADDR PORT [SIZE [COUNT]]
 *   ucp_sockaddr client ADDR PORT [SIZE [COUNT]]
 */
#include <arpa/inet.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <ucp/api/ucp.h>

static ucp_context_h ctx;
static ucp_worker_h worker;
static ucp_ep_h ep;
static volatile ucp_conn_request_h conn_req;

static void die(const char *what, ucs_status_t s)
{
	fprintf(stderr, "ucp_sockaddr: %s: %s\n", what, ucs_status_string(s));
	exit(2);
}

static double now(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec + t.tv_nsec / 1e9;
}

/* Progress until `req` (a request or a status) is done, at most 30 s. */
static ucs_status_t wait_req(void *req)
{
	if (req == NULL)
		return UCS_OK;
	if (UCS_PTR_IS_ERR(req))
		return UCS_PTR_STATUS(req);
	double end = now() + 30;
	ucs_status_t s;
	while ((s = ucp_request_check_status(req)) == UCS_INPROGRESS) {
		ucp_worker_progress(worker);
		if (now() > end) {
			fprintf(stderr, "ucp_sockaddr: a request did not complete in 30 s\n");
			exit(3);
		}
	}
	ucp_request_free(req);
	return s;
}

static void on_conn(ucp_conn_request_h req, void *arg)
{
	(void)arg;
	conn_req = req;
}

static void on_err(void *arg, ucp_ep_h e, ucs_status_t s)
{
	(void)arg;
	(void)e;
	fprintf(stderr, "ucp_sockaddr: endpoint error: %s\n", ucs_status_string(s));
}

static unsigned char byte_of(int msg, size_t i)
{
	return (unsigned char)(msg * 13 + i * 7 + 1);
}

static unsigned long sum_of(const unsigned char *b, size_t n)
{
	unsigned long s = 0;
	for (size_t i = 0; i < n; i++)
		s = s * 31 + b[i];
	return s;
}

int main(int argc, char **argv)
{
	if (argc < 4) {
		fprintf(stderr, "usage: %s server|client ADDR PORT [SIZE [COUNT]]\n", argv[0]);
		return 2;
	}
	int server = strcmp(argv[1], "server") == 0;
	size_t size = argc > 4 ? strtoul(argv[4], NULL, 0) : 65536;
	int count = argc > 5 ? atoi(argv[5]) : 100;
	struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(atoi(argv[3]))};
	if (inet_pton(AF_INET, argv[2], &sa.sin_addr) != 1) {
		fprintf(stderr, "ucp_sockaddr: %s: not an IPv4 address\n", argv[2]);
		return 2;
	}
	ucp_params_t p = {.field_mask = UCP_PARAM_FIELD_FEATURES,
			  .features = UCP_FEATURE_TAG | UCP_FEATURE_STREAM};
	ucs_status_t s = ucp_init(&p, NULL, &ctx);
	if (s != UCS_OK)
		die("ucp_init", s);
	ucp_worker_params_t wp = {.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE,
				  .thread_mode = UCS_THREAD_MODE_SINGLE};
	if ((s = ucp_worker_create(ctx, &wp, &worker)) != UCS_OK)
		die("ucp_worker_create", s);
	ucp_ep_params_t ep_params = {
		.field_mask = UCP_EP_PARAM_FIELD_ERR_HANDLER | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE,
		.err_mode = UCP_ERR_HANDLING_MODE_PEER,
		.err_handler = {.cb = on_err},
	};
	if (server) {
		ucp_listener_params_t lp = {
			.field_mask = UCP_LISTENER_PARAM_FIELD_SOCK_ADDR |
				      UCP_LISTENER_PARAM_FIELD_CONN_HANDLER,
			.sockaddr = {.addr = (struct sockaddr *)&sa, .addrlen = sizeof(sa)},
			.conn_handler = {.cb = on_conn},
		};
		ucp_listener_h l;
		if ((s = ucp_listener_create(worker, &lp, &l)) != UCS_OK)
			die("ucp_listener_create", s);
		printf("listening on %s:%s\n", argv[2], argv[3]);
		fflush(stdout);
		double end = now() + 30;
		while (conn_req == NULL) {
			ucp_worker_progress(worker);
			if (now() > end) {
				fprintf(stderr, "ucp_sockaddr: no client in 30 s\n");
				return 3;
			}
		}
		ep_params.field_mask |= UCP_EP_PARAM_FIELD_CONN_REQUEST;
		ep_params.conn_request = conn_req;
	} else {
		ep_params.field_mask |= UCP_EP_PARAM_FIELD_FLAGS | UCP_EP_PARAM_FIELD_SOCK_ADDR;
		ep_params.flags = UCP_EP_PARAMS_FLAGS_CLIENT_SERVER;
		ep_params.sockaddr.addr = (struct sockaddr *)&sa;
		ep_params.sockaddr.addrlen = sizeof(sa);
	}
	if ((s = ucp_ep_create(worker, &ep_params, &ep)) != UCS_OK)
		die("ucp_ep_create", s);
	unsigned char *buf = malloc(size);
	ucp_request_param_t rp = {.op_attr_mask = 0};
	int bad = 0;
	double t0 = now();
	for (int m = 0; m < count; m++) {
		unsigned long sum, want;
		if (server) {
			memset(buf, 0, size);
			if ((s = wait_req(ucp_tag_recv_nbx(worker, buf, size, m, ~0ull, &rp))) != UCS_OK)
				die("ucp_tag_recv_nbx", s);
			for (size_t i = 0; i < size; i++)
				if (buf[i] != byte_of(m, i)) {
					fprintf(stderr, "server: message %d byte %zu: %u\n", m, i, buf[i]);
					bad = 1;
					break;
				}
			sum = sum_of(buf, size);
			if ((s = wait_req(ucp_tag_send_nbx(ep, &sum, sizeof(sum), m, &rp))) != UCS_OK)
				die("ucp_tag_send_nbx", s);
		} else {
			for (size_t i = 0; i < size; i++)
				buf[i] = byte_of(m, i);
			want = sum_of(buf, size);
			if ((s = wait_req(ucp_tag_send_nbx(ep, buf, size, m, &rp))) != UCS_OK)
				die("ucp_tag_send_nbx", s);
			if ((s = wait_req(ucp_tag_recv_nbx(worker, &sum, sizeof(sum), m, ~0ull, &rp))) != UCS_OK)
				die("ucp_tag_recv_nbx", s);
			if (sum != want) {
				fprintf(stderr, "client: message %d: checksum %lx, want %lx\n", m, sum, want);
				bad = 1;
			}
		}
	}
	double secs = now() - t0;
	/* One stream message, client to server. */
	char word[16] = "stream ok";
	size_t got = 0;
	if (server) {
		memset(word, 0, sizeof(word));
		while (got < sizeof(word)) {
			size_t n;
			void *r = ucp_stream_recv_nbx(ep, word + got, sizeof(word) - got, &n, &rp);
			if (r == NULL) {
				got += n;
				continue;
			}
			if ((s = wait_req(r)) != UCS_OK)
				die("ucp_stream_recv_nbx", s);
			got = sizeof(word);
		}
		if (strcmp(word, "stream ok") != 0) {
			fprintf(stderr, "server: stream got %.16s\n", word);
			bad = 1;
		}
	} else if ((s = wait_req(ucp_stream_send_nbx(ep, word, sizeof(word), &rp))) != UCS_OK) {
		die("ucp_stream_send_nbx", s);
	}
	int result = bad, peer = 0;
	/* The verdicts cross once more, so neither side closes early. */
	if (server) {
		if ((s = wait_req(ucp_tag_send_nbx(ep, &result, sizeof(result), 1u << 30, &rp))) != UCS_OK)
			die("ucp_tag_send_nbx", s);
	} else {
		if ((s = wait_req(ucp_tag_recv_nbx(worker, &peer, sizeof(peer), 1u << 30, ~0ull, &rp))) != UCS_OK)
			die("ucp_tag_recv_nbx", s);
	}
	ucp_request_param_t cp = {.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS,
				  .flags = UCP_EP_CLOSE_FLAG_FORCE};
	wait_req(ucp_ep_close_nbx(ep, &cp));
	if (!result && !peer)
		printf("ucp sockaddr ok: %d messages of %zu bytes, %.1f us per round trip\n", count,
		       size, secs / count * 1e6);
	free(buf);
	ucp_worker_destroy(worker);
	ucp_cleanup(ctx);
	return result || peer;
}
