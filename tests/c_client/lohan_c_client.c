/* A tiny C program on liblohan_client's C ABI, used by the tests (and a
 * usage example). Each command prints one line per step; on failure it prints
 * "<step>: <STATUS_NAME>: <message>" and exits with the status code.
 *
 *   lohan_c_client SOCKET roundtrip NAME   hello, create, attach, list, detach,
 *                                          status JSON, delete
 *   lohan_c_client SOCKET create NAME      create; prints the job id
 *   lohan_c_client SOCKET attach JOB_ID    attach, then detach
 *   lohan_c_client SOCKET hold JOB_ID      attach, print "holding", wait
 *                                          until killed (a dying client)
 *   lohan_c_client SOCKET arena JOB_ID     attach, open the data plane, write
 *                                          and check the whole arena, close
 *   lohan_c_client SOCKET arena-hold JOB_ID  attach, open the data plane,
 *                                          print "holding", wait until killed
 *   lohan_c_client SOCKET arena-only JOB_ID  open the data plane without
 *                                          attaching first
 *   lohan_c_client SOCKET delete JOB_ID
 *   lohan_c_client SOCKET list             one line per visible job
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "lohan/lohan_client.h"

static int failed(const char* step, int status) {
  printf("%s: %s: %s\n", step, lohan_status_name(status), lohan_last_error());
  return status;
}

static int roundtrip(lohan_client* client, const char* name) {
  uint32_t major = 0, minor = 0;
  lohan_client_protocol(client, &major, &minor);
  printf("hello: daemon %s protocol %u.%u uid %u jobs-capability %d\n",
         lohan_client_daemon_version(client), major, minor,
         lohan_client_caller_uid(client),
         lohan_client_has_capability(client, "jobs"));

  lohan_job_info* job = NULL;
  int status = lohan_job_create(client, name, 1 << 20, 0, &job);
  if (status != LOHAN_OK) return failed("create", status);
  char id[64];
  snprintf(id, sizeof(id), "%s", lohan_job_info_id(job));
  printf("create: %s name %s owner %u state %d\n", id, lohan_job_info_name(job),
         lohan_job_info_owner_uid(job), lohan_job_info_state(job));
  lohan_job_info_destroy(job);

  status = lohan_job_attach(client, id, &job);
  if (status != LOHAN_OK) return failed("attach", status);
  printf("attach: state %d pid %d\n", lohan_job_info_state(job),
         (int)lohan_job_info_attached_pid(job));
  lohan_job_info_destroy(job);

  lohan_job_list* list = NULL;
  status = lohan_jobs_list(client, &list);
  if (status != LOHAN_OK) return failed("list", status);
  printf("list: %zu jobs\n", lohan_job_list_size(list));
  if (lohan_job_list_get(list, lohan_job_list_size(list)) != NULL) {
    printf("list: out-of-range get returned a job\n");
    return LOHAN_INTERNAL;
  }
  lohan_job_list_destroy(list);

  status = lohan_job_delete(client, id);
  printf("delete-while-attached: %s\n", lohan_status_name(status));
  if (status != LOHAN_FAILED_PRECONDITION) return LOHAN_INTERNAL;

  status = lohan_job_detach(client, id, NULL);
  if (status != LOHAN_OK) return failed("detach", status);
  printf("detach: ok\n");

  char* json = NULL;
  status = lohan_client_status_json(client, &json);
  if (status != LOHAN_OK) return failed("status", status);
  printf("status: %s\n",
         strstr(json, "\"daemon_version\"") ? "json ok" : "json bad");
  lohan_string_free(json);

  status = lohan_job_delete(client, id);
  if (status != LOHAN_OK) return failed("delete", status);
  printf("delete: ok\n");

  /* Bad input gets a status, never a crash. */
  status = lohan_job_create(client, NULL, 0, 0, &job);
  printf("null-name: %s\n", lohan_status_name(status));
  if (status != LOHAN_INVALID_ARGUMENT) return LOHAN_INTERNAL;
  status = lohan_job_create(client, "bad name!", 0, 0, &job);
  printf("bad-name: %s\n", lohan_status_name(status));
  if (status != LOHAN_INVALID_ARGUMENT) return LOHAN_INTERNAL;
  lohan_data_plane* plane = NULL;
  status = lohan_data_plane_open(client, NULL, &plane);
  printf("null-plane-job: %s\n", lohan_status_name(status));
  if (status != LOHAN_INVALID_ARGUMENT) return LOHAN_INTERNAL;
  lohan_model_spec spec;
  memset(&spec, 0, sizeof(spec));
  lohan_model* model = NULL;
  status = lohan_model_register(client, NULL, "j-1", &spec, &model);
  printf("null-model-plane: %s\n", lohan_status_name(status));
  if (status != LOHAN_INVALID_ARGUMENT) return LOHAN_INTERNAL;
  status = lohan_model_iter_begin(NULL);
  printf("null-model: %s\n", lohan_status_name(status));
  if (status != LOHAN_INVALID_ARGUMENT) return LOHAN_INTERNAL;

  /* A binding's settings, checked before there is a model: the refusal
   * names the ModelSpec field; a good spec leaves no field behind. */
  status = lohan_model_spec_check_settings(NULL);
  printf("null-settings: %s\n", lohan_status_name(status));
  spec.struct_size = sizeof(spec);
  spec.dtype = LOHAN_DTYPE_FP32;
  spec.lr = 1e-3;
  spec.beta1 = 0.9;
  spec.beta2 = 0.999;
  spec.eps = -1.0;
  status = lohan_model_spec_check_settings(&spec);
  printf("settings-eps: %s field %s\n", lohan_status_name(status),
         lohan_last_error_field());
  spec.eps = 0.0;
  status = lohan_model_spec_check_settings(&spec);
  printf("settings-ok: %s field '%s'\n", lohan_status_name(status),
         lohan_last_error_field());
  return LOHAN_OK;
}

/* Fills the arena with a pattern and reads it back. */
static int touch_arena(lohan_data_plane* plane) {
  unsigned char* arena = lohan_data_plane_arena(plane);
  uint64_t size = lohan_data_plane_arena_size(plane);
  for (uint64_t i = 0; i < size; i += 4096) arena[i] = (unsigned char)(i >> 12);
  for (uint64_t i = 0; i < size; i += 4096) {
    if (arena[i] != (unsigned char)(i >> 12)) return LOHAN_DATA_LOSS;
  }
  return LOHAN_OK;
}

static int arena_command(lohan_client* client, const char* job_id,
                         int attach_first, int hold) {
  int status = LOHAN_OK;
  if (attach_first) {
    status = lohan_job_attach(client, job_id, NULL);
    if (status != LOHAN_OK) return failed("attach", status);
  }
  lohan_data_plane* plane = NULL;
  status = lohan_data_plane_open(client, job_id, &plane);
  if (status != LOHAN_OK) return failed("data-plane", status);
  status = touch_arena(plane);
  if (status != LOHAN_OK) return failed("arena", status);
  printf("arena: %llu bytes\n",
         (unsigned long long)lohan_data_plane_arena_size(plane));
  if (hold) {
    printf("holding %s\n", job_id);
    fflush(stdout);
    for (;;) pause();
  }
  lohan_data_plane_destroy(plane);
  if (attach_first) status = lohan_job_detach(client, job_id, NULL);
  return status;
}

int main(int argc, char** argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: %s SOCKET COMMAND [ARG]\n", argv[0]);
    return 2;
  }
  const char* command = argv[2];
  const char* arg = argc > 3 ? argv[3] : NULL;
  lohan_client* client = NULL;
  int status = lohan_client_connect(argv[1], &client);
  if (status != LOHAN_OK) return failed("connect", status);

  if (strcmp(command, "roundtrip") == 0 && arg) {
    status = roundtrip(client, arg);
  } else if (strcmp(command, "create") == 0 && arg) {
    /* Optional 4th argument: host pool bytes. */
    const uint64_t pool = argc > 4 ? strtoull(argv[4], NULL, 10) : 0;
    lohan_job_info* job = NULL;
    status = lohan_job_create(client, arg, pool, 0, &job);
    if (status == LOHAN_OK)
      printf("%s\n", lohan_job_info_id(job));
    else
      failed("create", status);
    lohan_job_info_destroy(job);
  } else if (strcmp(command, "attach") == 0 && arg) {
    status = lohan_job_attach(client, arg, NULL);
    if (status == LOHAN_OK) status = lohan_job_detach(client, arg, NULL);
    if (status == LOHAN_OK)
      printf("attach: ok\n");
    else
      failed("attach", status);
  } else if (strcmp(command, "hold") == 0 && arg) {
    status = lohan_job_attach(client, arg, NULL);
    if (status != LOHAN_OK) {
      failed("hold", status);
    } else {
      printf("holding %s\n", arg);
      fflush(stdout);
      for (;;) pause();
    }
  } else if (strcmp(command, "arena") == 0 && arg) {
    status = arena_command(client, arg, 1, 0);
  } else if (strcmp(command, "arena-hold") == 0 && arg) {
    status = arena_command(client, arg, 1, 1);
  } else if (strcmp(command, "arena-only") == 0 && arg) {
    status = arena_command(client, arg, 0, 0);
  } else if (strcmp(command, "delete") == 0 && arg) {
    status = lohan_job_delete(client, arg);
    if (status == LOHAN_OK)
      printf("delete: ok\n");
    else
      failed("delete", status);
  } else if (strcmp(command, "status") == 0) {
    char* json = NULL;
    status = lohan_client_status_json(client, &json);
    if (status == LOHAN_OK)
      printf("%s\n", json);
    else
      failed("status", status);
    lohan_string_free(json);
  } else if (strcmp(command, "list") == 0) {
    lohan_job_list* list = NULL;
    status = lohan_jobs_list(client, &list);
    if (status == LOHAN_OK) {
      for (size_t i = 0; i < lohan_job_list_size(list); ++i) {
        const lohan_job_info* job = lohan_job_list_get(list, i);
        printf("%s %s %u\n", lohan_job_info_id(job), lohan_job_info_name(job),
               lohan_job_info_owner_uid(job));
      }
    } else {
      failed("list", status);
    }
    lohan_job_list_destroy(list);
  } else {
    fprintf(stderr, "unknown command '%s'\n", command);
    status = 2;
  }
  lohan_client_destroy(client);
  return status;
}
