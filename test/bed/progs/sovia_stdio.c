/* A stdio program over a TCP socket, as unmodified programs write them:
 * fdopen(sock, "r+"), fprintf, fflush, fgets. The server answers every line
 * with its number and the line reversed; the client checks every answer.
 *
 *   sovia-stdio -s ADDR PORT                 serve one connection
 *   sovia-stdio -c ADDR PORT LINES [GO]      send LINES lines, check the replies;
 *                                            with GO, wait after the first line
 *                                            until the file GO exists */
#include <arpa/inet.h>
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

static int resolve(const char *host, const char *port, struct addrinfo **ai)
{
	struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM};
	int r = getaddrinfo(host, port, &hints, ai);
	if (r) {
		fprintf(stderr, "sovia-stdio: %s:%s: %s\n", host, port, gai_strerror(r));
		return -1;
	}
	return 0;
}

static void reverse(char *s)
{
	size_t n = strlen(s);
	for (size_t i = 0; i < n / 2; i++) {
		char t = s[i];
		s[i] = s[n - 1 - i];
		s[n - 1 - i] = t;
	}
}

static int serve(const char *host, const char *port)
{
	struct addrinfo *ai;
	if (resolve(host, port, &ai) < 0)
		return 1;
	int ls = socket(ai->ai_family, SOCK_STREAM, 0);
	int one = 1;
	setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	if (ls < 0 || bind(ls, ai->ai_addr, ai->ai_addrlen) < 0 || listen(ls, 4) < 0) {
		perror("sovia-stdio: listen");
		return 1;
	}
	freeaddrinfo(ai);
	int c = accept(ls, NULL, NULL);
	if (c < 0) {
		perror("sovia-stdio: accept");
		return 1;
	}
	close(ls);
	FILE *fp = fdopen(c, "r+");
	if (!fp) {
		perror("sovia-stdio: fdopen");
		return 1;
	}
	char line[4096];
	long n = 0;
	while (fgets(line, sizeof(line), fp)) {
		line[strcspn(line, "\n")] = '\0';
		reverse(line);
		fprintf(fp, "%ld %s\n", ++n, line);
		fflush(fp);
	}
	if (ferror(fp)) {
		perror("sovia-stdio: read");
		return 1;
	}
	fclose(fp);
	printf("sovia-stdio: server answered %ld lines\n", n);
	return 0;
}

/* Wait (at most 10 minutes) until `path` exists. */
static int wait_for(const char *path)
{
	struct stat st;
	for (int i = 0; i < 6000; i++) {
		if (stat(path, &st) == 0)
			return 0;
		usleep(100000);
	}
	fprintf(stderr, "sovia-stdio: %s never came\n", path);
	return -1;
}

static int client(const char *host, const char *port, long lines, const char *go)
{
	struct addrinfo *ai;
	if (resolve(host, port, &ai) < 0)
		return 1;
	int s = -1;
	for (int tries = 0; tries < 100; tries++) { /* the server may still be starting */
		s = socket(ai->ai_family, SOCK_STREAM, 0);
		if (connect(s, ai->ai_addr, ai->ai_addrlen) == 0)
			break;
		close(s);
		s = -1;
		usleep(100000);
	}
	freeaddrinfo(ai);
	if (s < 0) {
		perror("sovia-stdio: connect");
		return 1;
	}
	FILE *fp = fdopen(s, "r+");
	if (!fp) {
		perror("sovia-stdio: fdopen");
		return 1;
	}
	char sent[256], want[300], got[4096];
	for (long i = 1; i <= lines; i++) {
		/* Lines of varying length, some longer than stdio's buffer chunks. */
		int len = snprintf(sent, sizeof(sent), "line %ld ", i);
		for (long k = 0; k < (i * 7) % 200 && len < (int)sizeof(sent) - 1; k++)
			sent[len++] = (char)('a' + (i + k) % 26);
		sent[len] = '\0';
		fprintf(fp, "%s\n", sent);
		fflush(fp);
		if (!fgets(got, sizeof(got), fp)) {
			fprintf(stderr, "sovia-stdio: no reply to line %ld\n", i);
			return 1;
		}
		reverse(sent);
		snprintf(want, sizeof(want), "%ld %s\n", i, sent);
		if (strcmp(got, want) != 0) {
			fprintf(stderr, "sovia-stdio: line %ld: got '%s' want '%s'\n", i, got, want);
			return 2;
		}
		if (i == 1 && go && wait_for(go) < 0)
			return 1;
	}
	shutdown(fileno(fp), SHUT_WR);
	if (fgets(got, sizeof(got), fp)) {
		fprintf(stderr, "sovia-stdio: unexpected data after the last reply\n");
		return 2;
	}
	fclose(fp);
	printf("sovia-stdio: OK %ld lines\n", lines);
	return 0;
}

int main(int argc, char **argv)
{
	if (argc == 4 && strcmp(argv[1], "-s") == 0)
		return serve(argv[2], argv[3]);
	if ((argc == 5 || argc == 6) && strcmp(argv[1], "-c") == 0)
		return client(argv[2], argv[3], atol(argv[4]), argc == 6 ? argv[5] : NULL);
	fprintf(stderr, "usage: sovia-stdio -s ADDR PORT | -c ADDR PORT LINES [GO]\n");
	return 1;
}
